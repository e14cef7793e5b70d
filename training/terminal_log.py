"""What a terminal would show for a program's raw output. Pure: no Django.

Training output is written for a terminal: progress bars redraw one line with carriage
returns (hundreds of times per epoch), and colours and cursor moves come as ANSI escape
sequences. Shown raw in a page, that is a wall of `\\x1b[K` and repeated half-lines. Here each
line keeps only what a terminal would finally display on it, and escape sequences are dropped."""

import re

# CSI (ESC [ … final byte), OSC (ESC ] … BEL or ESC \), and the two-byte escapes (ESC + one char).
TOKEN = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|[\r\b]|[^\x1b\r\b]+|\x1b")
ERASE_LINE = re.compile(r"\x1b\[([0-2]?)K")


def _render_line(raw: str) -> str:
    """One line (no newline in it) as it ends up on screen: a carriage return moves the cursor
    to the start and later text overwrites, backspace steps back, `ESC[K` erases to the end."""
    cells: list[str] = []
    cursor = 0
    for piece in TOKEN.findall(raw):
        if piece == "\r":
            cursor = 0
        elif piece == "\b":
            cursor = max(0, cursor - 1)
        elif piece.startswith("\x1b"):
            erase = ERASE_LINE.fullmatch(piece)
            if erase is None:
                continue  # colours, cursor moves, titles: nothing to show
            mode = erase.group(1) or "0"
            if mode == "0":
                del cells[cursor:]
            elif mode == "1":
                cells[:cursor] = [" "] * min(cursor, len(cells))
            else:
                cells = []
        else:
            for char in piece:
                if char < " " and char != "\t":
                    continue  # other control characters (bell, …) print nothing
                if cursor < len(cells):
                    cells[cursor] = char
                else:
                    cells.extend(" " * (cursor - len(cells)))
                    cells.append(char)
                cursor += 1
    return "".join(cells).rstrip()


def render_terminal_text(text: str) -> str:
    """The text a terminal would show: each progress line once, in its last state, and no
    escape codes. `\\r\\n` is an ordinary line end."""
    lines = text.replace("\r\n", "\n").split("\n")
    return "\n".join(_render_line(line) for line in lines)
