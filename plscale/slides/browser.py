"""A built deck opened in headless Chromium: every slide renders, every image loads, nothing overflows.

A copy of the deck's HTML gets a script that, once the page has loaded, lays every slide out
(Marp's viewer shows one at a time), measures each one's content against its 1280 x 720 box,
loads every image, and writes its findings into the page; Chromium's --dump-dom hands the page
back and the findings are read from it.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

from plscale.errors import UserError

SLACK_PX = 2  # rounding in layout; more than this beyond the slide is overflow

PROBE = r"""
<script>
window.addEventListener('load', async () => {
  const out = {slides: [], images: []};
  document.querySelectorAll('svg[data-marpit-svg]').forEach(s => { s.style.display = 'block'; });
  document.querySelectorAll('svg[data-marpit-svg] > foreignObject > section').forEach((sec, i) => {
    const clipped = [...sec.querySelectorAll('pre, table')].filter(el => el.scrollWidth > el.clientWidth + 2).length;
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
    import os

    for candidate in (os.environ.get("CHROME_PATH"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


def count_slides(markdown: str) -> int:
    """Slides in a Marp source: `---` separators outside code fences, after the front matter."""
    lines, fenced, rulers = markdown.splitlines(), False, 0
    body = lines
    if lines and lines[0].strip() == "---":
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), 0)
        body = lines[end + 1:]
    for line in body:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.strip() == "---":
            rulers += 1
    return rulers + 1


def probe(html: Path, chromium: str, timeout: float = 60) -> dict:
    """The probe's findings for one built deck."""
    html = html.resolve()
    probed = html.with_name(f".{html.stem}.probe.html")
    probed.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
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
        raise UserError(f"Chromium opened {html} but the probe wrote nothing (exit {out.returncode}): "
                        f"{out.stderr.strip().splitlines()[-1:] or 'no message'}")
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
