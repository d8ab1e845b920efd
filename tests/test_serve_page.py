"""The page at ``/`` in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
installed by ``make dev``/``make test`` where missing), driven by Selenium: it loads, lists
a pushed model with its eval metrics, shows live server metrics, and a fill-mask query from
its form shows the same top token the API gives. Whatever the page shows is text, never
markup: a version whose manifest carries a script payload is shown literally and runs
nothing."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from conftest import tiny_config

from shoestring.model_repository import ModelRepository
from shoestring.serve.page import PAGE
from shoestring.serve.server import ServerThread, load_router
from shoestring.serve.settings import make_settings

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip(
            "no chromium/chromedriver on this machine (run `make browser` as root "
            "with apt-get to install Debian's chromium and chromium-driver)"
        )
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e .[dev])")
    return chromium, driver


@pytest.fixture()
def browser():
    chromium, driver = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="shoestring-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    b = webdriver.Chrome(service=Service(driver), options=options)
    b.set_page_load_timeout(60)
    try:
        yield b
    finally:
        b.quit()
        shutil.rmtree(profile, ignore_errors=True)


# A hostile manifest: markup in a metric's name and value and in ``created``. Inserted as
# HTML, the <img> would run its onerror (a <script> set through innerHTML does not run).
PAYLOAD = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def _plant_payload(repo: ModelRepository) -> None:
    path = repo.resolve("bert:1").path.parent / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["metrics"][PAYLOAD] = 1.5
    manifest["metrics"]["note"] = PAYLOAD  # not a number: skipped and reported
    manifest["created"] = PAYLOAD
    path.write_text(json.dumps(manifest))


def test_the_page_never_inserts_markup_built_from_data() -> None:
    """The page builds its DOM from text nodes only: no HTML parsing of anything the server
    sends (the old page built rows with innerHTML and missed escaping a metric value)."""
    script = PAGE[PAGE.index("<script>") :]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink
    # Text goes in through append/replaceChildren of strings (text nodes) and setAttribute.
    assert re.search(r"e\.append\(c instanceof Node \? c : String\(", script)


def _serve(pydocs_dir: Path, tmp_path: Path, **settings: object):
    from shoestring.eval.mlm_loss import evaluate_run
    from shoestring.train.loop import train

    run = tmp_path / "run"
    train(tiny_config(steps=8), pydocs_dir, run)
    evaluate_run(run, None)
    repo = ModelRepository(tmp_path / "models")
    repo.push(run, "bert")
    repo.tag("bert:1", "prod")
    _plant_payload(repo)
    s = make_settings(port=0, max_length=64, **settings)
    return ServerThread(load_router(["bert:prod"], s, repo), s)


@pytest.fixture()
def server(pydocs_dir: Path, tmp_path: Path):
    with _serve(pydocs_dir, tmp_path) as srv:
        yield srv


KEY = "page-key-0123456789"


@pytest.fixture()
def keyed_server(pydocs_dir: Path, tmp_path: Path):
    with _serve(pydocs_dir, tmp_path, api_key=KEY) as srv:
        yield srv


@pytest.mark.slow  # a training run, an eval and a browser, ~30 s
def test_the_page_lists_models_and_runs_a_fill_mask_query(browser, server: ServerThread) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    text = "the [MASK] of a list"
    api = httpx.post(server.url + "/v1/fill-mask", json={"inputs": text}, timeout=60).json()
    first = api["results"][0][0]
    top, position = first["candidates"][0]["token"], first["position"]

    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 60)
    row = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#models tr.model-row"))
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == "bert" and cells[1] == "1" and cells[2] == "prod"
    assert "mlm_loss=" in cells[4] and "current" in cells[5]
    # The payload is shown as the text it is, and none of it ran or became an element.
    assert f"{PAYLOAD}=1.500" in cells[4] and cells[3] == PAYLOAD
    assert browser.find_elements(By.CSS_SELECTOR, "#models img, #models script") == []
    assert browser.execute_script("return window.__pwned === undefined")
    # Live metrics: the API request above was counted.
    wait.until(
        lambda b: (
            b.find_element(By.CSS_SELECTOR, '[data-metric="requests answered"]').text
            not in ("", "–", "0")
        )
    )

    box = browser.find_element(By.ID, "text")
    box.clear()
    box.send_keys(text)
    browser.find_element(By.ID, "run").click()
    item = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#result ul.fill-mask li"))
    assert item.text.startswith(f"position {position}: {top} (")


@pytest.mark.slow  # a training run, an eval and a browser, ~30 s
def test_typing_the_key_refreshes_the_models_without_leaving_the_field(
    browser, keyed_server: ServerThread
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(keyed_server.url + "/")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: "401" in b.find_element(By.CSS_SELECTOR, "#models td.error").text)
    # The page's periodic refreshes stopped: from here only typing the key can refresh it.
    browser.execute_script("for (let i = 1; i < 10000; i++) clearInterval(i);")
    box = browser.find_element(By.ID, "key")
    box.send_keys(KEY)  # typed, never blurred (the old page refreshed on "change": on blur)
    row = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#models tr.model-row"))
    assert row.find_elements(By.TAG_NAME, "td")[0].text == "bert"
    assert browser.switch_to.active_element.get_attribute("id") == "key"
