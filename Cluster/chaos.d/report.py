"""The summary of a run (printed, and as JSON with --json) and the printed violations."""
import collections

from checker import INVARIANTS

FULL_PER_INVARIANT = 6      # violations printed in full (with history) per invariant
BRIEF_PER_INVARIANT = 30    # then one line each, up to this many


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(q / 100.0 * (len(v) - 1)))))
    return v[k]


def dist(values):
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3),
            "max": round(max(values), 3)}


def fmt_dist(d, unit="s"):
    if not d or d.get("n", 0) == 0:
        return "n=0"
    return f"n={d['n']} p50={d['p50']:.3f}{unit} p99={d['p99']:.3f}{unit} max={d['max']:.3f}{unit}"


def summarize(env, checker, faults, extra):
    """Everything the run measured, as a JSON-able dict."""
    calls = [c for c in env.model.calls if c.t1 is not None]
    durations = [c.duration for c in calls if c.outcome in ("ok", "error")]
    during = []
    by_kind = collections.defaultdict(list)
    for c in calls:
        if c.outcome not in ("ok", "error"):
            continue
        fs = faults.during(c.t0, c.t1)
        if fs:
            during.append(c.duration)
            for f in fs:
                by_kind[f.kind].append(c.duration)
    outcome = collections.Counter(c.outcome for c in calls)
    methods = collections.Counter(c.method for c in calls)
    retried = [c for c in calls if c.attempts > 1 or c.errors]
    retried_codes = collections.Counter(code for c in calls for _, _, code, _ in c.errors)
    fault_list = faults.history
    kinds = collections.Counter(f.kind for f in fault_list)
    conv = [f.convergence for f in fault_list if f.convergence is not None]
    resumed = [r["t1"] - r["broken_at"] for r in env.resume_attempts if r["outcome"] == "resumed" and r["broken_at"] is not None]
    by_inv = collections.Counter(v.inv for v in checker.violations)
    events = sum(1 for d in env.devices for e in d.events)
    return {
        "run": extra,
        "faults": {"total": len(fault_list), "by_kind": dict(sorted(kinds.items())),
                   "list": [f.to_json() for f in fault_list]},
        "calls": {"total": len(calls), "by_method": dict(sorted(methods.items())),
                  "by_outcome": dict(sorted(outcome.items())),
                  "needed_a_retry": len(retried), "retried_codes": dict(sorted(retried_codes.items())),
                  "session_moves": env.stats["moves"], "not_found_while_stream_broke": env.stats["notfound_after_break"]},
        "time_to_definite_answer": {"all": dist(durations), "during_faults": dist(during),
                                    "by_fault_kind": {k: dist(v) for k, v in sorted(by_kind.items())}},
        "streams": {"breaks": env.stats["breaks"], "resumes": dist(resumed),
                    "resume_attempts_failed": sum(1 for r in env.resume_attempts if r["outcome"] != "resumed"),
                    "sessions_lost": len(env.losses), "events_received": events},
        "convergence": {"after_faults": dist(conv), "not_converged": sum(1 for f in fault_list if f.convergence is None),
                        "over_3s": sum(1 for c in conv if c > 3.0), "final": env.final_convergence},
        "repair": env.repair,
        "ghost_samples": env.ghost_samples,
        "machine": env.machine,
        "checks": checker.counts,
        "indeterminate": {"keys_tainted": env.model.taint_total, "comparisons_skipped": checker.skipped},
        "violations": {"total": len(checker.violations),
                       "by_invariant": {str(k): by_inv.get(k, 0) for k in sorted(INVARIANTS)}},
        "harness_errors": env.errors,
    }


def print_violations(checker, out):
    by_inv = collections.defaultdict(list)
    for v in checker.violations:
        by_inv[v.inv].append(v)
    for inv in sorted(by_inv):
        vs = sorted(by_inv[inv], key=lambda v: (v.t if v.t is not None else 0))
        out(f"\n======== invariant {inv} ({INVARIANTS[inv]}): {len(vs)} violation(s)")
        for i, v in enumerate(vs):
            if i < FULL_PER_INVARIANT:
                t = f" at {v.t:.2f}s" if v.t is not None else ""
                out(f"\n-- [{inv}] {v.title}{t}")
                for line in v.lines:
                    out(f"     {line}")
                if v.history:
                    out("   history:")
                    for h in v.history:
                        out(f"     {h}")
            elif i < FULL_PER_INVARIANT + BRIEF_PER_INVARIANT:
                if i == FULL_PER_INVARIANT:
                    out("\n   more, one line each (all of them, with histories, are in the JSON):")
                t = f"{v.t:8.2f}s" if v.t is not None else "        -"
                out(f"   {t}  {v.title}")
            else:
                out(f"   ... and {len(vs) - i} more")
                break


def print_summary(s, out):
    r = s["run"]
    out(f"\n======== summary: {r['mode']} seed={r['seed']} nodes={r['nodes']} rf={r['rf']} "
        f"presence-timeout={r['presence_timeout']}s faults for {r['seconds']:.0f}s, {r['users']} users / {r['devices']} devices")
    f = s["faults"]
    out(f"faults injected: {f['total']}  " + ", ".join(f"{k}={v}" for k, v in f["by_kind"].items()))
    c = s["calls"]
    out(f"calls: {c['total']}  needed a retry: {c['needed_a_retry']}  session moves: {c['session_moves']}  "
        f"outcomes: " + ", ".join(f"{k}={v}" for k, v in c["by_outcome"].items()))
    if c["retried_codes"]:
        out("  failed attempts by code: " + ", ".join(f"{k}={v}" for k, v in c["retried_codes"].items())
            + (f"; NOT_FOUND while the stream broke (retried): {c['not_found_while_stream_broke']}" if c["not_found_while_stream_broke"] else ""))
    t = s["time_to_definite_answer"]
    out(f"time to a definite answer: all {fmt_dist(t['all'])}")
    out(f"                           during faults {fmt_dist(t['during_faults'])}")
    for k, d in t["by_fault_kind"].items():
        out(f"                             {k:16} {fmt_dist(d)}")
    st = s["streams"]
    out(f"streams: {st['breaks']} breaks, resumed {fmt_dist(st['resumes'])} (break to resumed), "
        f"{st['resume_attempts_failed']} failed resume attempts, {st['sessions_lost']} sessions lost, "
        f"{st['events_received']} events received")
    cv = s["convergence"]
    out(f"membership convergence after a fault: {fmt_dist(cv['after_faults'])}, over 3 s: {cv['over_3s']}, "
        f"never (10 s): {cv['not_converged']}; final: {cv['final']}")
    for fl in f["list"]:
        conv = "-" if fl["convergence_s"] is None else f"{fl['convergence_s']:.2f}s"
        out(f"    {fl['t_start']:8.2f}s {fl['kind']:16} {','.join(fl['nodes']):16} converged {conv}"
            + (f"  ({'; '.join(fl['notes'])})" if fl["notes"] else ""))
    rp = s["repair"]
    if rp:
        out(f"repair after the quiet period began: {rp}")
    out(f"ghost samples during the run: {s['ghost_samples']}; indeterminate keys: {s['indeterminate']['keys_tainted']} "
        f"(comparisons skipped: {s['indeterminate']['comparisons_skipped']})")
    m = s.get("machine") or {}
    if m:
        out(f"machine: load average mean {m['load_avg_mean']} max {m['load_avg_max']}; CPU busy {m['cpu_busy_pct']}% "
            f"(this run {m['cpu_this_run_pct']}%, other processes {m['cpu_others_pct']}%)")
    out("checked: " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in s["checks"].items()))
    v = s["violations"]
    out(f"VIOLATIONS: {v['total']}  " + "  ".join(f"[{k}] {INVARIANTS[int(k)]}: {n}" for k, n in v["by_invariant"].items()))
    if s["harness_errors"]:
        out("HARNESS ERRORS: " + "; ".join(s["harness_errors"][:5]))
