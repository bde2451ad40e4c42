"""eplb.Migrator on eplb's own bootstrap (ProcessGroup.from_env, the local launcher's environment),
for scripts without torch.distributed: 2 plain processes, a shape of the issue, byte-exact."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import eplb
import migration_cases as cases
group = eplb.ProcessGroup.from_env(timeout=30)
rank, world = group.rank, group.size
rng = np.random.default_rng(0)
old = cases.random_placement(rng, 2, 3 * world, 4)
new = cases.random_placement(rng, 2, 3 * world, 4)
weights = cases.make_weights(2, 3, "empty")
cases.fill(weights, old, rank)
report = eplb.Migrator(weights, group=group, timeout=20).migrate(old, new)
print(json.dumps({"rank": rank, "backend": group.backend, "wrong": cases.mismatches(weights, new, rank),
                  "verified": report["verified"]}))
"""


def test_migrator_over_eplbs_local_bootstrap(repo, tmp_path):
    rendezvous = tempfile.mkdtemp(dir=tmp_path)
    processes = []
    for rank in range(2):
        env = dict(os.environ, EPLB_RANK=str(rank), EPLB_SIZE="2", EPLB_BOOTSTRAP_DIR=rendezvous)
        processes.append(subprocess.Popen([sys.executable, "-c", SCRIPT, str(repo / "python" / "tests")], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=120)
        finally:
            process.kill()
        assert process.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    for rank, output in enumerate(outputs):
        assert output == {"rank": rank, "backend": "local", "wrong": [], "verified": True}
