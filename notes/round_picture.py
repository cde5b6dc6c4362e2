"""python notes/round_picture.py: the README's picture of each round, notes/round_picture.png.

Runs `npspec generate --html` on the shipped pair (prompt "ROMEO:", 48 new tokens, the default
gamma 4, temperature 0.8, top-p 0.95 and seed 0; the same tokens on every run, the time bars
differ) and screenshots the page with headless Chromium (Debian: apt-get install
chromium-headless-shell). Options: --out PNG, --html FILE (keep the page too).
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "chrome")
COMMAND = ["-m", "npspec.generate", "ROMEO:", "--max-new-tokens", "48", "--seed", "0", "--quiet"]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python notes/round_picture.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "round_picture.png"), help="the screenshot (default: %(default)s)")
    ap.add_argument("--html", default=None, help="also keep the page here")
    args = ap.parse_args(argv)
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print(f"round_picture: error: no Chromium on PATH (looked for {', '.join(BROWSERS)}); "
              "install one, e.g. apt-get install chromium-headless-shell", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(args.html or Path(tmp) / "round.html").resolve()
        subprocess.run([sys.executable, *COMMAND, "--html", str(page)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={Path(args.out).resolve()}", "--window-size=1100,760", page.as_uri()],
                       check=True, capture_output=True)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
