"""`entangle check --html` / `Report.to_html()`: the data step without a browser, the page in a
real headless Chromium (Debian's /usr/bin/chromium driven by playwright; skipped, with the
reason, where either is absent: `.ci/run` installs both)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from entangle_mlir import html_report
from entangle_mlir.cli import main
from entangle_mlir.core.mesh import Mesh
from entangle_mlir.core.relations import Opaque, Rel
from entangle_mlir.core.report import Report
from entangle_mlir.core.terms import make_arg
from entangle_mlir.driver import check_files, check_texts
from tests.shared import COMBINED_ADD, EXAMPLES_MLIR, REF_ADD, SHARDED_ADD

BUGGY = (EXAMPLES_MLIR / "megatron_mlp_missing_psum_tp4.ref.mlir",
         EXAMPLES_MLIR / "megatron_mlp_missing_psum_tp4.sharded.mlir")
PROVEN = (EXAMPLES_MLIR / "gpt2_block_dp2_tp4.ref.mlir",
          EXAMPLES_MLIR / "gpt2_block_dp2_tp4.sharded.mlir")
TERMINATORS = ("func.return", "stablehlo.return", "sdy.return")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _page(pair, **options) -> tuple[Report, html_report.Page]:
    report = check_files(str(pair[0]), str(pair[1]), reuse_layers=False, **options)
    return report, html_report.page_data(*report.html_page.args)


@pytest.fixture(scope="module")
def buggy() -> tuple[Report, html_report.Page]:
    return _page(BUGGY)


@pytest.fixture(scope="module")
def proven() -> tuple[Report, html_report.Page]:
    return _page(PROVEN)


def _uncoloured(lines: list[html_report.OpLine]) -> list[html_report.OpLine]:
    """Ops without a colour that should have one: all but terminators and reducer bodies (the
    op just before a `stablehlo.return`, read whole as its parent's reducer)."""
    found = []
    for i, line in enumerate(lines):
        if line.kind != html_report.NONE or line.text.split(" = ")[-1].startswith(TERMINATORS):
            continue
        following = lines[i + 1].text if i + 1 < len(lines) else ""
        if line.depth > 0 and following.startswith("stablehlo.return"):
            continue
        found.append(line)
    return found


# ----- the data step ---------------------------------------------------------------------------

def test_buggy_page_points_at_the_partial_sum(buggy) -> None:
    """The diagnostic links to the sharded dot_general whose partial sum is never reduced; the
    reference dot_general it stands for is marked as its counterpart."""
    report, page = buggy
    assert page.outcome == "bug" and page.headline.startswith("not proven: value is still")
    first = page.diagnostics[0]
    assert first.text == report.diagnostics[0].render().split("\n")[0]
    assert first.notes and first.anchor.startswith("s")
    op = next(line for line in page.sharded if line.anchor == first.anchor)
    assert "stablehlo.dot_general" in op.text and op.kind == html_report.PARTIAL
    assert op.loc == str(report.diagnostics[0].loc) and op.diagnostics == (0,)
    twin = [line for line in page.reference if line.counterpart]
    assert len(twin) == 1 and "stablehlo.dot_general" in twin[0].text
    assert [line for line in page.sharded if line.kind == html_report.UNRELATED]
    assert len({line.anchor for line in page.reference + page.sharded}) == \
        len(page.reference) + len(page.sharded)


def test_proven_page_colours_every_op(proven) -> None:
    report, page = proven
    assert report.proven and page.headline.startswith("verified")
    assert not page.diagnostics and page.assumptions == report.assumptions
    assert not _uncoloured(page.reference) and not _uncoloured(page.sharded)
    assert {line.kind for line in page.sharded} >= {html_report.TILED, html_report.PARTIAL,
                                                   html_report.REPLICATED}
    assert any(line.loc.startswith("examples/models.py:") for line in page.sharded)


def test_proven_page_draws_every_input_and_output(proven) -> None:
    """The dp2 x tp4 GPT-2 block: its activation input and output split over 'dp' along dim 0
    (two rows of four devices each); each output's grid follows its PartitionSpec."""
    report, page = proven
    assert len(page.outputs) == len(report.outputs) and page.inputs
    out = page.outputs[0]
    assert out.spec == report.outputs[0].partition_spec == "P('dp', None, None)"
    assert out.boxes == (((0, 1, 2, 3),), ((4, 5, 6, 7),))
    assert page.results[0][1] == report.outputs[0].rho
    x = page.inputs[0]
    assert x.spec == "P('dp', None, None)" and x.boxes == out.boxes
    assert any("'tp'" in grid.spec for grid in page.inputs)


def test_grid_boxes_follow_the_mesh() -> None:
    mesh = Mesh((("dp", 2), ("tp", 4)))
    assert html_report.grid_boxes((8, 16), (("dp",), ("tp",)), mesh) == tuple(
        tuple((r * 4 + c,) for c in range(4)) for r in range(2))
    assert html_report.grid_boxes((16, 8), (("tp",), ()), mesh) == tuple(
        ((c, c + 4),) for c in range(4))
    assert html_report.grid_boxes((16,), (("dp", "tp"),), mesh) == (
        tuple((d,) for d in range(8)),)
    assert html_report.grid_boxes((), (), mesh) == ((tuple(range(8)),),)
    assert html_report.grid_boxes((4, 4, 16), (("dp",), (), ("tp",)), mesh)[1][2] == (6,)


def test_spec_tiling_reads_partition_specs() -> None:
    assert html_report.spec_tiling("P('dp', None)", 3) == (("dp",), (), ())
    assert html_report.spec_tiling("P(('dp', 'tp'),)", 1) == (("dp", "tp"),)
    assert html_report.spec_tiling("P()", 0) == ()
    assert html_report.spec_tiling("", 2) is None
    assert html_report.spec_tiling("P(1)", 1) is None


def test_value_kind() -> None:
    term = make_arg(0, (4, 8), "f32")
    assert html_report.value_kind(Rel(term, ((), ("tp",)))) == html_report.TILED
    assert html_report.value_kind(Rel(term, ((), ()), partial=("tp",), kind="sum")) == \
        html_report.PARTIAL
    assert html_report.value_kind(Rel(term, ((), ()))) == html_report.REPLICATED
    assert html_report.value_kind(Rel(term, ((), ()), scope="global")) == html_report.GLOBAL
    assert html_report.value_kind(Opaque("lost")) == html_report.UNRELATED
    assert html_report.value_kind(None) == html_report.NONE


def test_everything_is_escaped() -> None:
    """Program text and file names reach the page as text, never as markup."""
    report = check_texts(REF_ADD, SHARDED_ADD, ref_file="a<b>&c.mlir",
                         sharded_file='s"<i>.mlir')
    page = report.to_html()
    assert "<b>&" not in page and "<i>" not in page
    assert "a&lt;b&gt;&amp;c.mlir" in page and "s&quot;&lt;i&gt;.mlir" in page
    assert "tensor&lt;2x4xf32&gt;" in page


def test_to_html_needs_the_driver() -> None:
    with pytest.raises(ValueError, match="no HTML page"):
        Report("proven").to_html()


def test_cli_writes_the_page(tmp_path: Path, capsys) -> None:
    combined = tmp_path / "add.mlir"
    combined.write_text(COMBINED_ADD)
    out = tmp_path / "report.html"
    assert main(["check", str(combined), "--html", str(out), "--no-confirm"]) == 0
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "verified" in text
    assert "http://" not in text and "https://" not in text and "src=" not in text
    assert "verified" in capsys.readouterr().out
    assert main(["check", str(combined), "--html", str(tmp_path / "no" / "x.html"),
                 "--no-confirm"]) == 2


# ----- in a browser ----------------------------------------------------------------------------

def _browser_missing() -> str:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is not installed (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    return ""


needs_browser = pytest.mark.skipif(bool(_browser_missing()), reason=_browser_missing() or "-")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright  # lazy: only where a browser runs

    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _open(browser, path: Path):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text)
            if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, errors, requests


@needs_browser
def test_buggy_page_in_a_browser(browser, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.html"
    assert main(["check", str(BUGGY[0]), str(BUGGY[1]), "--html", str(out),
                 "--no-confirm"]) == 1
    capsys.readouterr()
    page, errors, requests = _open(browser, out)
    assert requests == [out.as_uri()]
    link = page.locator("#diagnostics a").first
    anchor = link.get_attribute("href")
    op = page.locator(anchor)
    assert "value is still a partial sum" in link.text_content()
    assert "stablehlo.dot_general" in op.text_content() and "diverging" in op.get_attribute(
        "class")
    assert page.locator(".msg").first.is_visible()
    assert page.evaluate(f"document.querySelector('{anchor}').getBoundingClientRect().top") \
        > 900  # below the fold before the click
    link.click()
    page.wait_for_function(f"location.hash === '{anchor}'")
    assert page.evaluate("document.querySelector(':target').id") == anchor[1:]
    top = page.evaluate(f"document.querySelector('{anchor}').getBoundingClientRect().top")
    assert 0 <= top < 900
    assert op.is_visible()
    op.click()
    assert page.locator(f"{anchor} .rel").is_visible()  # a click shows its relation
    assert errors == []
    page.close()


@needs_browser
def test_proven_page_in_a_browser(browser, tmp_path: Path, proven) -> None:
    report, data = proven
    out = tmp_path / "report.html"
    out.write_text(report.to_html())
    page, errors, _ = _open(browser, out)
    assert page.locator("#verdict").text_content().startswith("verified")
    assert page.locator("#verdict").is_visible()
    colours = page.evaluate("""() => Array.from(document.querySelectorAll('.program .op'))
        .map(op => [op.dataset.kind, getComputedStyle(op).backgroundColor])""")
    assert len(colours) == len(data.reference) + len(data.sharded)
    white = {"rgb(255, 255, 255)", "rgba(0, 0, 0, 0)"}
    assert all(colour not in white for kind, colour in colours if kind != "none")
    assert sum(kind != "none" for kind, _ in colours) == sum(
        line.kind != "none" for line in data.reference + data.sharded)
    assert page.locator(".grid table").count() == len(data.inputs) + len(data.outputs)
    assert page.locator(".grid").last.locator("td").count() == 2
    assert errors == []
    page.close()


def screenshot(path: Path) -> None:
    """docs/html-report.png: the buggy demo's page (run by hand from the repository's root:
    `python -c 'from pathlib import Path; from tests.test_html_report import screenshot;
    screenshot(Path("docs/html-report.png"))'`; the committed one is reduced to 48 colours)."""
    from playwright.sync_api import sync_playwright  # lazy: only where a browser runs

    report = check_files(os.path.relpath(BUGGY[0]), os.path.relpath(BUGGY[1]),
                         reuse_layers=False)
    html = path.resolve().with_suffix(".html")
    html.write_text(report.to_html())
    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = chromium.new_page(viewport={"width": 1280, "height": 1330})
        page.goto(html.as_uri())
        page.screenshot(path=str(path), full_page=False)
        chromium.close()
    html.unlink()
