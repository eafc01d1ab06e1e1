"""The references' training configurations as their own config loaders build them, as JSON.

    python third_party/meanflow/extract_configs.py --meanflow=/path/to/meanflow \
        --imeanflow=/path/to/imeanflow

Gsunshine/meanflow: ``configs/load_config.py:get_config("run_b4")`` (``configs/run_b4.yml`` over
``configs/default.py``; the only preset file the repository has) ->
third_party/meanflow/configs.json. Lyy-iiis/imeanflow: ``get_config("train")`` and
``get_config("eval")`` (``configs/{train,eval}_config.yml`` over ``configs/default.py``) ->
third_party/imeanflow/configs.json. Each loader runs from its own checkout (a subprocess per
repository, as both name their package ``configs``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from configs.load_config import get_config
print(json.dumps({name: get_config(name).to_dict() for name in sys.argv[2:]}, sort_keys=True))
"""


def load(checkout: str, names: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, checkout, *names],
        check=True,
        capture_output=True,
        text=True,
        cwd=checkout,
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meanflow", required=True)
    parser.add_argument("--imeanflow", required=True)
    args = parser.parse_args()
    targets = (
        (args.meanflow, ["run_b4"], os.path.join(HERE, "configs.json")),
        (args.imeanflow, ["train", "eval"], os.path.join(HERE, "..", "imeanflow", "configs.json")),
    )
    for checkout, names, path in targets:
        with open(path, "w") as f:
            json.dump(load(checkout, names), f, indent=1, sort_keys=True)
            f.write("\n")
        print(path)


if __name__ == "__main__":
    main()
