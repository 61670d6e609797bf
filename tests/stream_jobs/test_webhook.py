import asyncio

from aiohttp import web

from steplens.stream_jobs.core import Alert
from steplens.stream_jobs.webhook import WebhookNotifier


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
