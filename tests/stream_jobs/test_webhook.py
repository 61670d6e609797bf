import asyncio

from aiohttp import web

from steplens.stream_jobs.engine.core import Alert
from steplens.stream_jobs.worker.webhook import WebhookNotifier


def alert(i):
    return Alert(
        "spike:loss",
        "critical",
        "firing",
        "run",
        "hint",
        f"fp{i}",
        "run-1",
        i,
        i,
        f"spike {i}",
        {"value": 40.0},
    )


def test_alerts_are_posted_and_a_server_error_is_retried():
    got = []
    calls = {"n": 0}

    async def handler(request):
        calls["n"] += 1
        if calls["n"] == 1:
            return web.Response(status=503)
        got.append(await request.json())
        return web.Response(status=204)

    async def main():
        app = web.Application()
        app.router.add_post("/hook", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        notifier = WebhookNotifier(f"http://127.0.0.1:{port}/hook", timeout_s=5)
        await notifier.start()
        notifier.notify(alert(1))
        notifier.notify(alert(2))
        await asyncio.wait_for(notifier.queue.join(), 20)
        await notifier.stop()
        await runner.cleanup()
        return notifier

    notifier = asyncio.run(main())
    assert [b["fingerprint"] for b in got] == ["fp1", "fp2"]
    assert got[0]["rule"] == "spike:loss" and "critical" in got[0]["text"]
    assert notifier.sent == 2 and notifier.failed == 0 and calls["n"] == 3


def test_unreachable_webhook_gives_up_without_raising():
    async def main():
        notifier = WebhookNotifier("http://127.0.0.1:9/hook", timeout_s=1, retries=2)
        await notifier.start()
        notifier.notify(alert(1))
        await asyncio.wait_for(notifier.queue.join(), 20)
        await notifier.stop()
        return notifier

    notifier = asyncio.run(main())
    assert notifier.failed == 1 and notifier.sent == 0


def test_an_alert_sent_again_is_posted_once_and_a_new_episode_is_posted():
    """An alert scored again after a worker restart (the same fingerprint, state and start)
    pages once; the same alert firing again after it resolved is a new episode and pages; the
    memory of what was posted is bounded."""
    import dataclasses

    async def main():
        notifier = WebhookNotifier("http://127.0.0.1:9/hook", remember=3)
        first = alert(1)
        notifier.notify(first)
        notifier.notify(dataclasses.replace(first))  # scored again after a restart
        notifier.notify(dataclasses.replace(first, state="resolved", step=20))
        notifier.notify(dataclasses.replace(first, step=40, started_step=40))  # fires again
        for i in range(2, 6):
            notifier.notify(alert(i))
        notifier.notify(dataclasses.replace(first))  # forgotten: past ``remember``
        return notifier, [notifier.queue.get_nowait() for _ in range(notifier.queue.qsize())]

    notifier, queued = asyncio.run(main())
    assert [(a.fingerprint, a.state, a.started_step) for a in queued[:3]] == [
        ("fp1", "firing", 1),
        ("fp1", "resolved", 1),
        ("fp1", "firing", 40),
    ]
    assert notifier.repeated == 1 and len(notifier.seen) == 3 and len(queued) == 8


def test_an_escalation_pages_and_every_post_names_its_transition():
    """An incident that escalates (the same fingerprint and episode, a higher severity) pages
    again; a repeat carries the same idempotency key, so a receiver can drop it after a worker
    restart that forgot what it posted."""
    import dataclasses

    from steplens.stream_jobs.worker.webhook import idempotency_key, payload

    async def main():
        notifier = WebhookNotifier("http://127.0.0.1:9/hook")
        warn = dataclasses.replace(alert(1), severity="warning")
        notifier.notify(warn)
        notifier.notify(alert(1))  # the same episode, now critical
        return [notifier.queue.get_nowait() for _ in range(notifier.queue.qsize())]

    queued = asyncio.run(main())
    assert [a.severity for a in queued] == ["warning", "critical"]
    first, again = alert(1), alert(1)
    assert payload(first)["idempotency_key"] == idempotency_key(again)
    assert idempotency_key(queued[0]) != idempotency_key(queued[1])
