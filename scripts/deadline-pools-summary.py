#!/usr/bin/env python3
"""Summarises `spotplane bench deadline --json` lines of several traces (one object per policy
per invocation) into the tables of docs/benchmarks.md "Deadlines across pools": per setting
(pools, deadline, restart, move), the mean cost of each policy, spotplane's saving against
uniform-progress-rr, its ratio to the optimum, and misses; then the goals."""
import json
import sys
from collections import defaultdict

POLICIES = ["on-demand", "uniform-progress", "uniform-progress-rr", "spotplane", "optimal"]


def main(path):
    runs = defaultdict(dict)  # (pools, traces, W, D, R, M) -> policy -> line
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                o = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: {e}")
            key = (len(o["traces"]), tuple(o["traces"]), o["work_hours"], o["deadline_hours"],
                   o["restart_hours"], o["migrate_hours"])
            runs[key][o["policy"]] = o
    settings = defaultdict(list)
    for key, by in runs.items():
        if all(p in by for p in POLICIES):
            settings[(key[0],) + key[2:]].append(by)
    print("| pools | W h | D h | R h | M h | runs | " + " | ".join(POLICIES)
          + " | sp vs UP-rr | sp/opt mean, max | sp ≤ UP-rr | misses (sp, UP-rr) |")
    print("|" + "---|" * (len(POLICIES) + 10))
    tot = defaultdict(float)
    worst_setting_saving, ratios, misses, count = 1.0, [], 0, 0
    for s in sorted(settings):
        group = settings[s]
        mean = {p: sum(r[p]["cost_usd"] for r in group) / len(group) for p in POLICIES}
        for p in POLICIES:
            tot[p] += sum(r[p]["cost_usd"] for r in group)
        rs = [r["spotplane"]["cost_usd"] / r["optimal"]["cost_usd"] for r in group]
        ratios += rs
        count += len(group)
        saving = 1 - mean["spotplane"] / mean["uniform-progress-rr"]
        worst_setting_saving = min(worst_setting_saving, saving)
        le = sum(r["spotplane"]["cost_usd"] <= r["uniform-progress-rr"]["cost_usd"] + 1e-9
                 for r in group)
        sp_miss = sum(not r["spotplane"]["deadline_met"] for r in group)
        rr_miss = sum(not r["uniform-progress-rr"]["deadline_met"] for r in group)
        misses += sp_miss
        print(f"| {s[0]} | {s[1]:g} | {s[2]:g} | {s[3]:g} | {s[4]:g} | {len(group)} | "
              + " | ".join(f"{mean[p]:.2f}" for p in POLICIES)
              + f" | {100 * saving:.1f}% | {sum(rs) / len(rs):.3f}, {max(rs):.3f} | "
              f"{le}/{len(group)} | {sp_miss}, {rr_miss} |")
    if not count:
        sys.exit(f"{path}: no complete runs")
    print()
    print(f"runs: {count}; spotplane misses: {misses}")
    print(f"total: spotplane {tot['spotplane']:.2f}, uniform-progress-rr "
          f"{tot['uniform-progress-rr']:.2f}, optimal {tot['optimal']:.2f} USD")
    print(f"spotplane vs uniform-progress-rr: {100 * (1 - tot['spotplane'] / tot['uniform-progress-rr']):.1f}% "
          f"cheaper in total; the worst setting's mean {100 * worst_setting_saving:.1f}%")
    mean_ratio = sum(ratios) / len(ratios)
    within = sum(r <= 1.10 for r in ratios)
    print(f"spotplane / optimal: mean {mean_ratio:.3f}, max {max(ratios):.3f}; "
          f"within 10% on {within}/{len(ratios)} runs; total {tot['spotplane'] / tot['optimal']:.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: deadline-pools-summary.py FILE.jsonl")
    main(sys.argv[1])
