"""A folder tree of photographs for input benchmarks: `train/<class>/<n>.jpg` and a small `test/`.

No photographs can be downloaded at run time, and none are in Debian's packages in a form this
needs, so the sources are the nine colour photographs that scikit-image's wheel carries in
skimage/data (astronaut, chelsea, coffee, hubble_deep_field, ihc, motorcycle_left and _right,
retina, rocket), taken from the wheel file without installing it. Each image of the tree is a
crop of one of them at its own resolution (never upscaled, which would make it smoother than a
photograph), of an ImageNet-like size (500 x 375 or 375 x 500, smaller where the photograph is),
mirrored at random, saved as JPEG (quality 90 unless --quality says, the bench's 95) with
4:2:0 chroma (Pillow's default, and the common case of photographs): a few bits per pixel, as
photographs have, unlike noise.

  python photo_tree.py WHEEL OUT --train 1024 --test 16 --classes 10 --quality 95
"""
import argparse
import io
import random
import zipfile
from pathlib import Path

from PIL import Image

PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg", "ihc.png",
          "motorcycle_left.png", "motorcycle_right.png", "retina.jpg", "rocket.jpg"]


def photographs(wheel):
    with zipfile.ZipFile(wheel) as z:
        return [Image.open(io.BytesIO(z.read(f"skimage/data/{name}"))).convert("RGB")
                for name in PHOTOS]


def crop(photo, rng):
    w, h = photo.size
    cw, ch = (500, 375) if rng.random() < 0.75 else (375, 500)  # ImageNet: mostly landscape
    cw, ch = min(cw, w), min(ch, h)
    x, y = rng.randrange(w - cw + 1), rng.randrange(h - ch + 1)
    out = photo.crop((x, y, x + cw, y + ch))
    return out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("wheel")
    p.add_argument("out")
    p.add_argument("--train", type=int, default=1024)
    p.add_argument("--test", type=int, default=16)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--quality", type=int, default=90)
    a = p.parse_args()
    rng = random.Random(1)
    photos = photographs(a.wheel)
    total = 0
    for split, n in (("train", a.train), ("test", a.test)):
        for i in range(n):
            folder = Path(a.out) / split / f"{i % a.classes:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            img = crop(photos[rng.randrange(len(photos))], rng)
            path = folder / f"{i:05d}.jpg"
            img.save(path, quality=a.quality)
            total += path.stat().st_size
    print(f"photo tree: {a.train} + {a.test} JPEGs, {total / (a.train + a.test) / 1e3:.0f} kB "
          f"each on average, in {a.out}")


if __name__ == "__main__":
    main()
