"""A dependency-free PNG line chart: the demo's reward and mismatch per step, both paths.

Rendered into an RGB pixel grid with a 3×5 bitmap font and written with zlib; small and exact, so the
demo needs nothing beyond the core dependencies.
"""

import struct
import zlib

# 3x5 glyphs, rows top to bottom, 3 bits per row (MSB = left).
GLYPHS = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7), "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1), "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7),
    "a": (2, 5, 7, 5, 5), "b": (6, 5, 6, 5, 6), "c": (7, 4, 4, 4, 7), "d": (6, 5, 5, 5, 6), "e": (7, 4, 6, 4, 7),
    "f": (7, 4, 6, 4, 4), "g": (7, 4, 5, 5, 7), "h": (5, 5, 7, 5, 5), "i": (7, 2, 2, 2, 7), "j": (1, 1, 1, 5, 7),
    "k": (5, 5, 6, 5, 5), "l": (4, 4, 4, 4, 7), "m": (5, 7, 7, 5, 5), "n": (6, 5, 5, 5, 5), "o": (7, 5, 5, 5, 7),
    "p": (7, 5, 7, 4, 4), "q": (7, 5, 5, 7, 1), "r": (6, 5, 6, 5, 5), "s": (7, 4, 7, 1, 7), "t": (7, 2, 2, 2, 2),
    "u": (5, 5, 5, 5, 7), "v": (5, 5, 5, 5, 2), "w": (5, 5, 7, 7, 5), "x": (5, 5, 2, 5, 5), "y": (5, 5, 2, 2, 2),
    "z": (7, 1, 2, 4, 7), ".": (0, 0, 0, 0, 2), "-": (0, 0, 7, 0, 0), "|": (2, 2, 2, 2, 2), "(": (1, 2, 2, 2, 1),
    ")": (4, 2, 2, 2, 4), ":": (0, 2, 0, 2, 0), " ": (0, 0, 0, 0, 0), "/": (1, 1, 2, 4, 4), "+": (0, 2, 7, 2, 0),
}
WHITE, BLACK, GREY = (255, 255, 255), (40, 40, 40), (200, 200, 200)
COLORS = {"contract": (31, 119, 180), "native": (255, 127, 14)}
WIDTH, HEIGHT = 720, 520
LEFT, PANEL_WIDTH, PANEL_HEIGHT = 70, 620, 160
PANEL_TOPS = {"accuracy": 40, "mismatch": 270}
# The y range runs this fraction of the data's span past each end, so that a series at its minimum
# (the contract's mismatch: 0 on every step) lies on a labelled grid line above the x axis, not on it.
Y_PAD = 0.1
MAX_X_TICKS = 8


class Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(WHITE * (width * height))

    def dot(self, x: int, y: int, color, size: int = 1) -> None:
        for dx in range(size):
            for dy in range(size):
                px, py = x + dx, y + dy
                if 0 <= px < self.width and 0 <= py < self.height:
                    i = 3 * (py * self.width + px)
                    self.pixels[i : i + 3] = bytes(color)

    def line(self, x0: float, y0: float, x1: float, y1: float, color, size: int = 2) -> None:
        steps = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for s in range(steps + 1):
            t = s / steps
            self.dot(round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t), color, size)

    def text(self, x: int, y: int, text: str, color=BLACK, scale: int = 2) -> None:
        for k, ch in enumerate(text.lower()):
            rows = GLYPHS.get(ch, GLYPHS[" "])
            for r, bits in enumerate(rows):
                for c in range(3):
                    if bits >> (2 - c) & 1:
                        self.dot(x + (4 * k + c) * scale, y + r * scale, color, scale)

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width : 3 * (y + 1) * self.width]) for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def x_ticks(first: int, last: int) -> list[int]:
    """Round step numbers from `first` to `last`: every 1, 2, 5, 10, 20, … steps, at most MAX_X_TICKS."""
    every = 1
    while (last - first) // every + 1 > MAX_X_TICKS:
        every = every * 5 // 2 if str(every)[0] == "2" else every * 2
    return list(range(-(-first // every) * every, last + 1, every))


def _panel(canvas: Canvas, top: int, title: str, series: dict[str, list[tuple[int, float]]]) -> None:
    """One chart of (step, value) series: y grid lines at the data's min, middle and max, x ticks at round steps."""
    bottom, right = top + PANEL_HEIGHT, LEFT + PANEL_WIDTH
    steps = [step for points in series.values() for step, _ in points] or [0]
    values = [v for points in series.values() for _, v in points] or [0.0]
    first, last = min(steps), max(steps)
    low, high = min(values), max(values)
    if high == low:
        high = low + 1.0
    pad = Y_PAD * (high - low)

    def x(step: float) -> float:
        return LEFT + (step - first) / max(last - first, 1) * PANEL_WIDTH

    def y(value: float) -> float:
        return bottom - (value - low + pad) / (high - low + 2 * pad) * PANEL_HEIGHT

    canvas.text(LEFT, top - 18, title)
    for frac in (0.0, 0.5, 1.0):
        value = low + frac * (high - low)
        canvas.line(LEFT, y(value), right, y(value), GREY, 1)
        canvas.text(4, int(y(value)) - 5, f"{value:.2g}")
    canvas.line(LEFT, top, LEFT, bottom, BLACK, 1)
    canvas.line(LEFT, bottom, right, bottom, BLACK, 1)
    for step in x_ticks(first, last):
        canvas.line(x(step), bottom, x(step), bottom + 4, BLACK, 1)
        label = str(step)
        canvas.text(round(x(step)) - (4 * len(label) - 1), bottom + 7, label)
    for name in sorted(series, key=lambda n: n == "contract"):  # the contract's series last, on top
        xy = [(x(step), y(value)) for step, value in series[name]]
        for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
            canvas.line(x0, y0, x1, y1, COLORS.get(name, BLACK))
        if len(xy) == 1:
            canvas.dot(int(xy[0][0]), int(xy[0][1]), COLORS.get(name, BLACK), 3)


def write_plot(path, histories: dict[str, list[dict]]) -> None:
    """Accuracy and max |Δlogp| per step for each path ("contract", "native")."""
    canvas = Canvas(WIDTH, HEIGHT)
    accuracy = {name: [(m["step"], m["accuracy"]) for m in h] for name, h in histories.items()}
    mismatch = {name: [(m["step"], m.get("rollout_train_logprob_abs_diff_max", 0.0)) for m in h] for name, h in histories.items()}
    _panel(canvas, PANEL_TOPS["accuracy"], "accuracy per step", accuracy)
    _panel(canvas, PANEL_TOPS["mismatch"], "max |rollout - train logprob| per step", mismatch)
    below = PANEL_TOPS["mismatch"] + PANEL_HEIGHT + 24
    canvas.text(LEFT + PANEL_WIDTH // 2 - 8, below, "step")
    x = LEFT
    for name, color in COLORS.items():
        if name in histories:
            canvas.line(x, HEIGHT - 20, x + 24, HEIGHT - 20, color, 3)
            canvas.text(x + 32, HEIGHT - 25, name, color)
            x += 200
    with open(path, "wb") as out:
        out.write(canvas.png())
