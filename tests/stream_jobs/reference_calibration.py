"""The calibration of ``steplens.stream_jobs.engine.calibration`` one value at a time, in
plain Python: the reference its compiled kernel is held equal to."""

from __future__ import annotations

import math

from steplens.stream_jobs.engine.calibration import CalibrationConfig


class Reference:
    def __init__(self, cfg: CalibrationConfig) -> None:
        self.cfg = cfg
        self.warm: list[float] = []
        self.u = self.m1 = self.m2 = 0.0
        self.seen = 0
        self.sat = 0.0  # share of saturated raw scores
        self.counted = 0

    def update(self, r: float) -> float:
        cfg = self.cfg
        if math.isnan(r) or r == -math.inf:
            return math.nan
        self.counted = min(self.counted + 1, cfg.horizon)
        if r == math.inf:  # saturated: as rare as saturation has been, then learnt
            out = 1 - max(self.sat, 1.0 / (cfg.reach * (self.seen + 1)))
            self.sat += (1 - self.sat) / self.counted
            return out if self.seen >= cfg.warmup else math.nan
        self.sat -= self.sat / self.counted
        r = max(r, 0.0)
        if self.seen < cfg.warmup:
            self.warm.append(r)
            self.seen += 1
            if self.seen == cfg.warmup:
                s = sorted(self.warm)
                self.u = s[int(cfg.q * (len(s) - 1))]
                ex = [x - self.u for x in s if x > self.u]
                if ex:
                    self.m1 = sum(ex) / len(ex)
                    self.m2 = sum(e * e for e in ex) / len(ex)
                else:
                    self.m1 = 0.1 * self.u
                    self.m2 = 2 * self.m1 * self.m1
            return math.nan
        var = self.m2 - self.m1 * self.m1
        xi = min(max(0.5 * (1 - self.m1 * self.m1 / var) if var > 0 else 0.0, 0.0), cfg.xi_max)
        beta = self.m1 * (1 - xi)
        if not beta > 0:
            beta = 2.2250738585072014e-308
        u, tail = self.u, 1 - cfg.q
        if r > u:
            p = tail * (
                (1 + xi * (r - u) / beta) ** (-1 / xi) if xi > 0 else math.exp(-(r - u) / beta)
            )
        elif u > 0:
            p = 1 - cfg.q * r / u
        else:
            p = 1.0
        p = self.sat + (1 - self.sat) * p
        p = max(p, 1.0 / (cfg.reach * (self.seen + 1)))
        self.u = max(0.0, u + cfg.eta * beta * ((1.0 if r > u else 0.0) - tail))
        if r > self.u:
            e = r - self.u
            self.m1 += cfg.alpha * (e - self.m1)
            self.m2 += cfg.alpha * (e * e - self.m2)
        self.seen += 1
        return 1 - p
