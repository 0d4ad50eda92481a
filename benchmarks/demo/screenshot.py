"""The README's screenshot of ``adaflash demo --dtype fp32``: the page on the embedded default (bundled
SmolLM2-135M target, drafter and length head, CPU) after one generation, taken with headless Chromium.

Usage: python benchmarks/demo/screenshot.py [out.png]   (default benchmarks/demo/screenshot.png; needs
apt-get install chromium chromium-driver, and pip install selenium pillow)
"""

import socket
import sys
import tempfile
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1760",
)


def main(out: Path) -> None:
    # Imported here: the browser stack is optional, and the smoke test imports this module without it.
    from PIL import Image
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    from adaflash_hf.demo import EXAMPLES, DemoArgs, load_demo

    demo = load_demo(DemoArgs(dtype="fp32"))  # fp32: the two texts agree token for token
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    with tempfile.TemporaryDirectory() as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            wait = WebDriverWait(browser, 300)
            browser.get(f"http://127.0.0.1:{port}/")
            prompt = wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#prompt textarea")))
            prompt.clear()
            prompt.send_keys(EXAMPLES[0])
            browser.find_element(By.ID, "generate").click()
            for side in ("plain-text", "adaflash-text"):
                wait.until(
                    expected_conditions.presence_of_element_located(
                        (By.CSS_SELECTOR, f'#{side} .adaflash-text:not([data-finish=""])')
                    )
                )
            browser.find_element(By.TAG_NAME, "body").click()  # no focus ring on the button
            browser.save_screenshot(str(out))
            print(browser.find_element(By.ID, "adaflash-stats").text)
        finally:
            browser.quit()
            demo.close()
    Image.open(out).convert("RGB").quantize(colors=64).save(out, optimize=True)  # a few colours: small PNG
    print(f"wrote {out} ({out.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "screenshot.png"))
