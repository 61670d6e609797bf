"""The scenarios of `steplens demo --act`: what each one injects, and what its remedies must do.

Each scenario is one training run, trained twice from the same seed: with the remedies and
without. A plan is a pure function of the scenario and the run length, so the training script
(which injects) and the demo (which scores) agree without talking. Steps here are the loop's
iterations (``demo_train``): a rewind sends the model's step back, not the iterations, so a
rewound run meets nothing twice; a bad shard's samples come back at their iterations until
they are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from steplens.stack.demo_incidents import Incident

SCENARIOS = ("blip", "lr_blowup", "bad_shard", "healthy")
# lr x100 for 4 steps: this model's loss goes from 2.1 to 5.4 and ends about 0.9 above the
# healthy run after 150 more steps (x30, the plain demo's, is back on trend in about 80)
BLOWUP_FACTOR = 100.0
BLOWUP_STEPS = 4


@dataclass(frozen=True)
class Expect:
    """What the run with remedies must show against the run without."""

    advice: bool  # any advice at all (healthy: none)
    acted: tuple[str, ...] = ()  # actions that must be carried out
    never: tuple[str, ...] = ()  # actions that must not be
    better: bool = False  # final loss strictly better beyond the tolerance (else: no worse)


EXPECT = {
    "blip": Expect(advice=True, never=("rewind", "lower_lr")),
    "lr_blowup": Expect(advice=True, acted=("rewind",), better=True),
    "bad_shard": Expect(advice=True, acted=("skip_samples",)),
    "healthy": Expect(advice=False),
}


def checkpoint_every(steps: int) -> int:
    """About six checkpoints a run, on a round number of steps (25 at least), as a user
    checkpointing every 1,000 steps of a 6,000-step job would."""
    return max(25, steps // 6 // 25 * 25)


def plan_scenario(name: str, steps: int, batch_size: int = 16, ranks: int = 2) -> list[Incident]:
    """The incidents of scenario ``name`` in a run of ``steps`` (at least 160)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}")
    if steps < 160:
        raise ValueError("a scenario needs at least 160 steps")
    onset = int(steps * 0.45)
    if name == "blip":
        return [
            Incident(
                "blip",
                onset,
                onset,
                0,
                "one batch of random tokens on rank 0, never seen again",
                ("spike", "loss", "batch", "data"),
            )
        ]
    if name == "lr_blowup":
        return [
            Incident(
                "lr_blowup",
                onset,
                onset + BLOWUP_STEPS - 1,
                None,
                f"learning rate x{BLOWUP_FACTOR:.0f} for {BLOWUP_STEPS} steps: the model diverges",
                ("lr", "loss", "grad", "spike", "diverg"),
                {"factor": BLOWUP_FACTOR},
            )
        ]
    if name == "bad_shard":
        first, every = steps // 4, steps // 5
        last = first + (steps - 30 - first) // every * every
        return [
            Incident(
                "bad_shard",
                first,
                last,
                None,
                f"the same {batch_size * ranks} corrupted samples (one batch a rank) come back "
                f"every {every} steps",
                ("spike", "loss", "batch", "data"),
                {"every": float(every)},
            )
        ]
    return []


def visits(incident: Incident) -> list[int]:
    """The steps a recurring incident happens at (a one-off: its first step)."""
    every = int(incident.params.get("every", 0))
    if every <= 0:
        return [incident.first_step]
    return list(range(incident.first_step, incident.last_step + 1, every))
