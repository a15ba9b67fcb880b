"""Synthetic seven-segment digits (28x28 uint8): the offline stand-in for MNIST.
Random position, size, slant, stroke width and noise make it a real (if easy) task."""

import numpy as np

# Segments as (x0, y0, x1, y1) in a unit box: top, upper-left, upper-right, middle,
# lower-left, lower-right, bottom.
SEGMENTS = np.array([[0, 0, 1, 0], [0, 0, 0, .5], [1, 0, 1, .5], [0, .5, 1, .5],
                     [0, .5, 0, 1], [1, .5, 1, 1], [0, 1, 1, 1]], dtype=np.float32)
ON = {0: "012456", 1: "25", 2: "02346", 3: "02356", 4: "1235", 5: "01356",
      6: "013456", 7: "025", 8: "0123456", 9: "012356"}


def synthetic_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    ys, xs = np.mgrid[0:28, 0:28].astype(np.float32)
    images = np.zeros((n, 28, 28), np.float32)
    for i, label in enumerate(labels):
        w, h = rng.uniform(9, 14), rng.uniform(16, 22)
        x0, y0 = rng.uniform(3, 25 - w), rng.uniform(2, 26 - h)
        slant, width = rng.uniform(-0.25, 0.25), rng.uniform(1.0, 2.2)
        for s in ON[int(label)]:
            ax, ay, bx, by = SEGMENTS[int(s)]
            ax, bx = x0 + ax * w + slant * (1 - ay) * h, x0 + bx * w + slant * (1 - by) * h
            ay, by = y0 + ay * h, y0 + by * h
            dx, dy = bx - ax, by - ay
            t = np.clip(((xs - ax) * dx + (ys - ay) * dy) / (dx * dx + dy * dy), 0, 1)
            dist = np.hypot(xs - (ax + t * dx), ys - (ay + t * dy))
            images[i] = np.maximum(images[i], np.clip(width + 0.5 - dist, 0, 1))
    images += rng.normal(0, 0.08, images.shape).astype(np.float32)
    return (np.clip(images, 0, 1) * 255).astype(np.uint8), labels.astype(np.int64)
