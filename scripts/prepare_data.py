"""Prepare one dataset: download and verify it, or generate it (dpstudy.data.store.prepare).

python scripts/prepare_data.py NAME --root results/data [--overrides '{"mirror": "..."}']
"""

from __future__ import annotations

import argparse
import json
import sys

from dpstudy.data import store as data
from dpstudy.study.datasets import check_overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help=f"one of {', '.join(data.DATASETS)}")
    parser.add_argument("--root", required=True, help="folder that holds one subfolder per dataset")
    parser.add_argument(
        "--overrides",
        default="{}",
        help="JSON object of the config's datasets.NAME (mirror, md5, train_size, test_size)",
    )
    args = parser.parse_args(argv)
    try:
        overrides = json.loads(args.overrides)
        print(data.prepare(args.name, args.root, check_overrides(args.name, overrides)))
    except json.JSONDecodeError as e:
        print(f"error: --overrides is not valid JSON: {e}", file=sys.stderr)
        return 2
    except (data.ConfigError, data.DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
