"""The tables of scripts/per-message, from the callgrind and strace outputs of its runs.

per-message.py WORK START STEP "TESTS" "SIZES"

A count per message is (run of START+2*STEP messages - run of START) / (2*STEP), taken
only over what grew by the same amount over each STEP (work); the rest is waiting.
"""

import collections
import os
import sys

work, start, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tests, sizes = sys.argv[4].split(), sys.argv[5].split()
lengths = (start, start + step, start + 2 * step)
OBJECTS = ("tool", "libibverbs", "provider", "libc", "other")


def object_kind(ob, tool):
    base = os.path.basename(ob)
    if base in (tool, "ib_" + tool):
        return "tool"
    if base.startswith("libibverbs"):
        return "libibverbs"
    if base.startswith("librxe") or base.startswith("libmlx"):
        return "provider"
    if base.startswith("libc.so") or base.startswith("libc-"):
        return "libc"
    return "other"


def read_callgrind(path):
    """{(object, address): Ir} and {(object, address): function} of one callgrind output."""
    counts, names = collections.Counter(), {}
    ob = fn = ""
    npos = 1
    skip_next = False
    with open(path) as f:
        for line in f:
            if skip_next:  # the inclusive cost of the call named on the line before
                skip_next = False
                continue
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
            elif line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
            elif line.startswith("calls="):
                skip_next = True
            elif line[:1] in "0123456789+-*" and line.strip():
                f = line.split()
                if len(f) <= npos:
                    continue
                key = (ob, f[0])
                counts[key] += int(f[npos])
                names[key] = fn
    return counts, names


def read_strace(path):
    calls = collections.Counter()
    with open(path) as f:
        for line in f:
            f_ = line.split()
            if len(f_) >= 5 and f_[0][0].isdigit() and f_[-1] != "total" and f_[3].isdigit():
                calls[f_[-1]] += int(f_[3])
    return calls


def split_linear(runs):
    """Keys whose growth is the same over both steps, give or take two (work), and the
    rest (wait). Two: a call made once more in one run and once less in the other
    (perftest's writes to its socket: 218, 417 and 618 `write`s for 200, 400 and 600
    messages) must not send every other call of the same function to "wait"; a loop that
    waits on timing does not repeat its count that closely."""
    c0, c1, c2 = runs
    keys = set(c0) | set(c1) | set(c2)
    lin = {k for k in keys if abs((c1.get(k, 0) - c0.get(k, 0)) - (c2.get(k, 0) - c1.get(k, 0))) <= 2}
    return lin, keys - lin


def per_message(side_runs, keys):
    c0, _, c2 = side_runs
    return sum(c2.get(k, 0) - c0.get(k, 0) for k in keys) / (2 * step)


results = {}  # (test, size, who, side) -> dict
for t in tests:
    for s in sizes:
        for who in ("ours", "theirs"):
            for side in ("client", "server"):
                cg, names = [], {}
                st = []
                counted = True
                for n in lengths:
                    base = f"{work}/{t}.{s}.{who}.{n}"
                    if os.path.exists(f"{base}.callgrind.{side}.cg"):
                        c, nm = read_callgrind(f"{base}.callgrind.{side}.cg")
                    else:  # a bandwidth server that ran as itself
                        c, nm, counted = collections.Counter(), {}, False
                    cg.append(c)
                    names.update(nm)
                    st.append(read_strace(f"{base}.strace.{side}.st"))
                lin, rest = split_linear(cg)
                by_obj = collections.Counter()
                by_fn = collections.Counter()
                for k in lin:
                    d = (cg[2].get(k, 0) - cg[0].get(k, 0)) / (2 * step)
                    by_obj[object_kind(k[0], t)] += d
                    by_fn[(object_kind(k[0], t), names.get(k, "?"))] += d
                slin, srest = split_linear(st)
                sys_per = {k: (st[2].get(k, 0) - st[0].get(k, 0)) / (2 * step) for k in slin}
                sys_wait = {k: (st[2].get(k, 0) - st[0].get(k, 0)) / (2 * step) for k in srest}
                results[t, s, who, side] = {
                    "counted": counted,
                    "work": per_message(cg, lin),
                    "wait": per_message(cg, rest),
                    "by_obj": by_obj,
                    "by_fn": by_fn,
                    "sys": {k: v for k, v in sys_per.items() if v},
                    "sys_wait": {k: v for k, v in sys_wait.items() if v},
                }


def sys_text(d):
    return " ".join(f"{k}:{v:.3g}" for k, v in sorted(d.items())) or "-"


print()
print(f"per message: runs of {lengths[2]} messages minus runs of {lengths[0]}, over {2 * step};")
print("work = instructions that grew by the same count (give or take two) over each step of the runs;")
print("wait = the rest (empty polls, spins on the buffer: timing's, set aside, not compared)")
print()
hdr = f"{'test':<10} {'size':>6} {'side':<7} {'ours':>8} {'perftest':>9} {'ratio':>6}  {'wait ours':>9} {'perftest':>9}  syscalls/msg ours | perftest"
print(hdr)
print("-" * len(hdr))
worse = []
for t in tests:
    for s in sizes:
        for side in ("client", "server"):
            a, b = results[t, s, "ours", side], results[t, s, "theirs", side]
            if not (a["counted"] and b["counted"]):
                print(f"{t:<10} {s:>6} {side:<7} {'-':>8} {'-':>9} {'-':>6}  {'-':>9} {'-':>9}  "
                      f"{sys_text(a['sys'])} | {sys_text(b['sys'])}   (instructions not counted: it waits)")
                continue
            ratio = a["work"] / b["work"] if b["work"] > 0 else float("nan")
            mark = ""
            # Above: by more than one instruction a message and 0.5% (a side that only
            # waits, a bandwidth server, counts a few instructions either way).
            if a["work"] > b["work"] + max(1.0, 0.005 * abs(b["work"])):
                mark = "  ABOVE"
                worse.append((t, s, side))
            print(
                f"{t:<10} {s:>6} {side:<7} {a['work']:>8.1f} {b['work']:>9.1f} {ratio:>6.3f}  "
                f"{a['wait']:>9.1f} {b['wait']:>9.1f}  {sys_text(a['sys'])} | {sys_text(b['sys'])}{mark}"
            )
            for who, r in (("ours", a), ("perftest", b)):
                parts = " ".join(f"{o} {r['by_obj'][o]:.1f}" for o in OBJECTS)
                extra = f"; timing-dependent syscalls {sys_text(r['sys_wait'])}" if r["sys_wait"] else ""
                print(f"{'':<26}{who:<9} {parts}{extra}")

print()
if worse:
    print("where ours does more work per message than perftest, the functions that differ most:")
    for t, s, side in worse:
        a = results[t, s, "ours", side]["by_fn"]
        b = results[t, s, "theirs", side]["by_fn"]
        print(f"  {t} -s {s} {side}: ours' top functions | perftest's top functions (instructions per message)")
        ta = a.most_common(8)
        tb = b.most_common(8)
        for i in range(max(len(ta), len(tb))):
            l = f"{ta[i][0][0]}:{ta[i][0][1][:48]} {ta[i][1]:.1f}" if i < len(ta) else ""
            r = f"{tb[i][0][0]}:{tb[i][0][1][:48]} {tb[i][1]:.1f}" if i < len(tb) else ""
            print(f"    {l:<70} | {r}")
else:
    print("ours does no more work per message than perftest on any row")
