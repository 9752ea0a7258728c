"""Prepare one dataset: download and verify it, generate it, or read your own (dpstudy.data.store.prepare).

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
    parser.add_argument("name", help=f"one of {', '.join(data.DATASETS)}, or a dataset of your own")
    parser.add_argument("--root", required=True, help="folder that holds one subfolder per dataset")
    parser.add_argument(
        "--overrides",
        default="{}",
        help="JSON object of the config's datasets.NAME (mirror, md5, train_size, test_size; a user "
        "dataset's source, path, test_path, test_fraction, image_size, channels, args; a text's "
        "tokenizer, vocab_size)",
    )
    parser.add_argument("--code-path", default="", help="where a user's dataset function is imported from")
    args = parser.parse_args(argv)
    code_path = args.code_path or None
    try:
        overrides = json.loads(args.overrides)
        print(data.prepare(args.name, args.root, check_overrides(args.name, overrides, code_path), code_path))
    except json.JSONDecodeError as e:
        print(f"error: --overrides is not valid JSON: {e}", file=sys.stderr)
        return 2
    except (data.ConfigError, data.DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
