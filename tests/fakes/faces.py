"""A face drawn deterministically (no photograph ships offline): a skin-toned oval on a plain
background with hair, brows, eyes, a nose and a mouth where a face has them, in proportions
OpenCV's frontal-face Haar cascade finds (checked at 96 to 1280 pixels a side, as PNG, JPEG
and H.264 frames). The same pixels on every run."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw


def drawn_face(size: tuple[int, int] = (320, 320)) -> np.ndarray:
    """An RGB array (height x width x 3) of a face filling most of the picture."""
    w, h = size
    image = Image.new("RGB", (w, h), (130, 110, 90))
    draw = ImageDraw.Draw(image)
    side = min(w, h)
    cx, cy = w // 2, h // 2
    fw, fh = int(side * 0.3), int(side * 0.38)  # the face's half width and half height

    def ellipse(x: int, y: int, rx: int, ry: int, colour: tuple[int, int, int]) -> None:
        draw.ellipse((x - rx, y - ry, x + rx, y + ry), fill=colour)

    def upper_half(x: int, y: int, rx: int, ry: int, colour: tuple[int, int, int]) -> None:
        draw.chord((x - rx, y - ry, x + rx, y + ry), 180, 360, fill=colour)

    ellipse(cx, cy, fw, fh, (225, 180, 150))  # skin
    upper_half(cx, cy - int(fh * 0.75), int(fw * 1.05), int(fh * 0.45), (40, 30, 30))  # hair
    eye_y = cy - int(fh * 0.22)
    for x in (cx - int(fw * 0.42), cx + int(fw * 0.42)):
        upper_half(x, eye_y - int(fh * 0.2), int(fw * 0.25), max(2, int(fh * 0.06)),
                   (50, 40, 40))  # brow
        ellipse(x, eye_y, int(fw * 0.2), int(fh * 0.08), (235, 235, 235))  # eye white
        ellipse(x, eye_y, int(fh * 0.09), int(fh * 0.09), (20, 30, 40))  # iris
    draw.line((cx, eye_y, cx - int(fw * 0.08), cy + int(fh * 0.18)), fill=(190, 140, 110),
              width=max(1, side // 100))  # nose
    nose_y = cy + int(fh * 0.2)
    draw.chord((cx - int(fw * 0.15), nose_y - int(fh * 0.05), cx + int(fw * 0.15),
                nose_y + int(fh * 0.05)), 0, 180, fill=(170, 120, 100))
    ellipse(cx, cy + int(fh * 0.48), int(fw * 0.35), int(fh * 0.08), (150, 60, 60))  # mouth
    return np.asarray(image)


def drawn_face_png(size: tuple[int, int] = (320, 320)) -> bytes:
    out = io.BytesIO()
    Image.fromarray(drawn_face(size)).save(out, "PNG")
    return out.getvalue()
