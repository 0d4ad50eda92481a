"""The demo page in a real headless browser: type a prompt, click Generate, watch both sides finish.

Chromium and chromedriver come from Debian (``apt-get install chromium chromium-driver``), Selenium from
the dev extra. Without them the test skips locally and fails in CI (``CI=true``), which installs them.
The screenshot goes to ``$ADAFLASH_SCREENSHOT`` when set (else into the test's temporary folder).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
from test_demo import FakeOPD, tiny_stack

from adaflash_hf.prompting import chat_prompt_ids

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# the closed network makes Chromium's background services hang without the last four flags
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1500",
)
PROMPT = "Hello world, hello there."
MAX_NEW_TOKENS = 40


def require_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    missing += [m for m in ("selenium", "gradio") if importlib.util.find_spec(m) is None]
    if missing:
        message = (
            f"the browser test needs {', '.join(missing)}: apt-get install -y chromium chromium-driver && "
            "pip install -e '.[dev]'"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def page():
    """The demo on tiny fp32 models with a fake OPD worker, served on a free localhost port in the background."""
    require_browser()
    from adaflash_hf.demo import build_demo

    target, drafter, tokenizer = tiny_stack()
    demo = build_demo(target, drafter, tokenizer, opd=FakeOPD(), max_new_tokens=MAX_NEW_TOKENS)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/", target, tokenizer
    finally:
        demo.close()


@pytest.fixture(scope="module")
def browser():
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory() as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def test_the_page_streams_both_sides_to_the_same_text(page, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    url, target, tokenizer = page
    wait = WebDriverWait(browser, 60)
    browser.get(url)
    prompt = wait.until(expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "#prompt textarea")))
    prompt.clear()
    prompt.send_keys(PROMPT)
    wait.until(expected_conditions.text_to_be_present_in_element((By.ID, "opd-status"), "adapter version 7"))  # on load
    browser.find_element(By.ID, "generate").click()

    finished = '#{} .adaflash-text:not([data-finish=""])'
    for side in ("plain-text", "adaflash-text"):
        wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, finished.format(side))))
    plain = browser.find_element(By.CSS_SELECTOR, "#plain-text .adaflash-text")
    adaflash = browser.find_element(By.CSS_SELECTOR, "#adaflash-text .adaflash-text")

    prompt_ids = chat_prompt_ids(tokenizer, PROMPT)
    reference = target.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)[
        0, len(prompt_ids) :
    ]
    assert plain.get_attribute("data-tokens") == adaflash.get_attribute("data-tokens") == str(len(reference))
    assert (
        plain.get_attribute("textContent")
        == adaflash.get_attribute("textContent")
        == tokenizer.decode(reference, skip_special_tokens=True)
    )
    assert adaflash.find_elements(By.CSS_SELECTOR, "span[data-source]")  # coloured spans

    stats = browser.find_element(By.ID, "adaflash-stats").text
    assert "τ (tokens per round)" in stats and "tok/s" in stats
    assert browser.find_element(By.CSS_SELECTOR, "#adaflash-stats [data-speedup]").text.endswith("×")
    assert "adapter version 7" in browser.find_element(By.ID, "opd-status").text
    assert browser.find_element(By.CSS_SELECTOR, "#adaflash-stats [data-agreement]").text == "Identical output: ✓"
    assert int(browser.find_element(By.ID, "adaflash-verify-lens").get_attribute("data-rounds")) >= 1

    screenshot = Path(os.environ.get("ADAFLASH_SCREENSHOT") or tmp_path / "demo.png")
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 0
