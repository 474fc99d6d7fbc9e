"""The demo's plot, decoded from its PNG: x tick labels drawn, and the contract's all-zero mismatch
series visible as its own line above the x axis rather than lying on it."""

import random
import struct
import zlib

import numpy as np

from isoexec.rl.plot import BLACK, COLORS, Canvas, write_plot

NUM_STEPS = 40


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB PNG whose rows all use filter 0 (as plot.py writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        chunks[kind] = chunks.get(kind, b"") + data[at + 8 : at + 8 + length]
        at += 12 + length
    width, height, depth, color_type = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color_type) == (8, 2)
    raw, stride = zlib.decompress(chunks[b"IDAT"]), 1 + 3 * width
    assert all(raw[y * stride] == 0 for y in range(height))
    return width, height, [raw[y * stride + 1 : (y + 1) * stride] for y in range(height)]


def mask(rows: list[bytes], color) -> list[bytes]:
    """Each row as bytes of b"1" where the pixel is `color`, b"0" elsewhere."""
    pixels = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), -1, 3)
    hits = (pixels == np.array(color, dtype=np.uint8)).all(axis=-1)
    return [bytes(row) for row in np.where(hits, ord("1"), ord("0")).astype(np.uint8)]


def find_text(image: list[bytes], text: str) -> list[tuple[int, int]]:
    """(x, y) of every place where `text`, as plot.py draws it in BLACK, appears in the BLACK mask `image`."""
    stamp = Canvas(4 * 2 * len(text) + 4, 14)
    stamp.text(2, 2, text)
    _, _, rows = decode_png(stamp.png())
    template = mask(rows, BLACK)[1:13]  # one blank row and column of margin on every side
    template = [row[1 : 4 * 2 * len(text) + 3] for row in template]
    anchor = next(k for k, row in enumerate(template) if b"1" in row)  # a row that cannot match blank space
    found = []
    for y in range(len(image) - len(template)):
        x = image[y + anchor].find(template[anchor])
        while x != -1:
            if all(image[y + k][x : x + len(t)] == t for k, t in enumerate(template)):
                found.append((x, y))
            x = image[y + anchor].find(template[anchor], x + 1)
    return found


def rows_covered(image: list[bytes], share: float) -> list[int]:
    return [y for y, row in enumerate(image) if row.count(b"1") >= share * len(row)]


def demo_histories() -> dict[str, list[dict]]:
    rng = random.Random(0)
    return {
        "contract": [{"step": i, "accuracy": 0.4 + i / 100, "rollout_train_logprob_abs_diff_max": 0.0} for i in range(NUM_STEPS)],
        "native": [{"step": i, "accuracy": 0.45 + rng.random() / 5, "rollout_train_logprob_abs_diff_max": 1e-7 + rng.random() * 2e-6}
                   for i in range(NUM_STEPS)],
    }


def test_the_contracts_zero_mismatch_line_is_drawn_above_the_x_axis(tmp_path):
    path = tmp_path / "plot.png"
    write_plot(path, demo_histories())
    width, height, rows = decode_png(path.read_bytes())
    lower = rows[height // 2 :]  # the mismatch panel is the lower one
    zero_line = rows_covered(mask(lower, COLORS["contract"]), 0.5)
    assert zero_line, "no contract-coloured line across the mismatch panel"
    axes = [y for y in rows_covered(mask(lower, BLACK), 0.5) if y > max(zero_line)]
    assert axes, "no x axis below the contract's zero line: the line lies on the panel's edge"
    assert min(axes) - max(zero_line) > 3, "the zero line touches the x axis"
    native_above = mask(lower[: min(zero_line)], COLORS["native"])
    assert any(b"1" in row for row in native_above)


def test_x_ticks_are_labelled_with_step_numbers(tmp_path):
    path = tmp_path / "plot.png"
    write_plot(path, demo_histories())
    _, height, rows = decode_png(path.read_bytes())
    black = mask(rows, BLACK)
    for label in ("10", "20", "30"):
        places = find_text(black, label)
        assert len(places) == 2, f"tick label {label!r} found at {places}, expected once under each panel"
    assert find_text(black, "step"), "no axis label"
    ten, twenty = sorted(find_text(black, "10"))[0], sorted(find_text(black, "20"))[0]
    assert twenty[0] > ten[0], "the labels do not run left to right"
