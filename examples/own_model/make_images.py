"""Make the example's image folder: a few hundred PNG files in one folder per class, as a user's
own photos would be laid out (torchvision's ImageFolder), drawn from dpstudy's generated patterns
at varied sizes so that the data rule has something to resize.

    python examples/own_model/make_images.py [--out examples/own_model/images] [--per-class 48]

Writing into a temporary folder and renaming it into place: a killed run leaves no half folder.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch
from PIL import Image

from dpstudy.data import synthetic

CLASSES = ("circle", "stripes", "blob")  # names only: three of the generator's ten patterns
SIZES = (40, 48, 56)  # pixels: every image is resized to the study's image_size (32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "images"))
    parser.add_argument("--per-class", type=int, default=48)
    args = parser.parse_args(argv)
    out = Path(args.out)
    staging = Path(tempfile.mkdtemp(prefix=".images-", dir=out.parent))
    count = 0
    for size in SIZES:
        # the generator draws its ten classes evenly: keep the first three
        n = args.per_class // len(SIZES) * synthetic.CLASSES
        protos = synthetic.prototypes(3, size, seed=7)
        images, labels = synthetic.samples(protos, n, size, torch.Generator().manual_seed(size))
        keep = labels < len(CLASSES)
        for image, label in zip(images[keep], labels[keep].tolist()):
            folder = staging / CLASSES[label]
            folder.mkdir(exist_ok=True)
            Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{size}px_{count:05d}.png")
            count += 1
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    print(f"{out}: {count} images in {len(CLASSES)} class folders")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
