"""A built deck opened in headless Chromium: every slide renders, every image loads, nothing overflows.

A copy of the deck's HTML gets a script that, once the page has loaded, lays every slide out
(Marp's viewer shows one at a time), measures each one's content against its 1280 x 720 box,
loads every image, and writes its findings into the page; Chromium's --dump-dom hands the page
back and the findings are read from it.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from plscale.errors import UserError

SLACK_PX = 2  # rounding in layout; more than this beyond the slide is overflow

PROBE = r"""
<script>
window.addEventListener('load', async () => {
  const out = {slides: [], images: []};
  document.querySelectorAll('svg[data-marpit-svg]').forEach(s => { s.style.display = 'block'; });
  document.querySelectorAll('svg[data-marpit-svg] > foreignObject > section').forEach((sec, i) => {
    const clipped = [...sec.querySelectorAll('pre, table')].filter(el => el.scrollWidth > el.clientWidth + SLACK_PX).length;
    out.slides.push({n: i + 1, width: sec.clientWidth, height: sec.clientHeight,
                     scroll_width: sec.scrollWidth, scroll_height: sec.scrollHeight, clipped: clipped,
                     content: sec.textContent.trim().length + sec.querySelectorAll('img').length});
  });
  const urls = [...new Set([...document.querySelectorAll('img')].map(img => img.getAttribute('src')))];
  out.images = await Promise.all(urls.map(u => new Promise(done => {
    const im = new Image();
    im.onload = () => done([u, im.naturalWidth]);
    im.onerror = () => done([u, 0]);
    im.src = u;
  })));
  const pre = document.createElement('pre');
  pre.id = 'plscale-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""
FOUND = re.compile(r'<pre id="plscale-probe">(.*?)</pre>', re.S)


def find_chromium() -> str | None:
    """Chromium (CHROME_PATH, else chromium, chromium-browser, google-chrome on PATH), or None."""
    for candidate in (os.environ.get("CHROME_PATH"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


def split_slides(markdown: str) -> list[str]:
    """A Marp source's slides: the text between `---` lines outside code fences, front matter dropped."""
    lines = markdown.splitlines()
    if lines and lines[0].strip() == "---":
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), 0)
        lines = lines[end + 1:]
    slides, current, fenced = [], [], False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.strip() == "---":
            slides.append("\n".join(current))
            current = []
        else:
            current.append(line)
    return slides + ["\n".join(current)]


def count_slides(markdown: str) -> int:
    return len(split_slides(markdown))


def probe(html: Path, chromium: str, timeout: float = 60) -> dict:
    """The probe's findings for one built deck."""
    html = html.resolve()
    fd, name = tempfile.mkstemp(dir=html.parent, prefix=f".{html.stem}.", suffix=".probe.html")  # beside it: same paths
    probed = Path(name)
    with os.fdopen(fd, "w") as handle:
        handle.write(html.read_text().replace("</body>", PROBE.replace("SLACK_PX", str(SLACK_PX)) + "</body>"))
    try:
        out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                              "--window-size=1280,720", "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UserError(f"Chromium did not finish opening {html} within {timeout:.0f} s.") from None
    finally:
        probed.unlink(missing_ok=True)
    found = FOUND.search(out.stdout)
    if not found:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"Chromium opened {html} but the probe wrote nothing (exit {out.returncode}): {last}")
    import html as html_lib

    return json.loads(html_lib.unescape(found.group(1)))


def problems(html: Path, expected_slides: int, chromium: str) -> list[str]:
    """One line per problem in the built deck; none when every slide rendered whole."""
    found = probe(html, chromium)
    issues = []
    if len(found["slides"]) != expected_slides:
        issues.append(f"{len(found['slides'])} slides rendered, the source has {expected_slides}")
    for s in found["slides"]:
        if not s["width"] or not s["height"] or not s["content"]:
            issues.append(f"slide {s['n']}: rendered empty ({s['width']}x{s['height']} px, no content)")
            continue
        if s["scroll_height"] > s["height"] + SLACK_PX:
            issues.append(f"slide {s['n']}: content is {s['scroll_height']} px tall, the slide {s['height']}: "
                          f"{s['scroll_height'] - s['height']} px overflow at the bottom")
        if s["scroll_width"] > s["width"] + SLACK_PX:
            issues.append(f"slide {s['n']}: content is {s['scroll_width']} px wide, the slide {s['width']}")
        if s["clipped"]:
            issues.append(f"slide {s['n']}: {s['clipped']} code block(s) or table(s) wider than the slide (lines cut)")
    for url, width in found["images"]:
        if not width:
            issues.append(f"image {url} did not load (a broken path?)")
    return issues
