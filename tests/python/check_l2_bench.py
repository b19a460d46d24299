"""Checks an `lmcache bench l2 --format json` result: every store and load succeeded."""

import json
import sys

metrics = json.load(open(sys.argv[1]))["metrics"]
ops = {m["operation"]: m for k, m in metrics.items() if k.startswith("op_")}
for name in ("Store", "Load"):
    op = ops[name]
    if op["rounds_timed_out"] or op["total_success"] != op["total_keys"]:
        sys.exit(f"lmcache bench l2: {name}: {op['total_success']} of {op['total_keys']} keys succeeded")
    print(f"ok {name}: {op['total_keys']} keys, {op['throughput_avg_mbps']:.0f} MB/s")
