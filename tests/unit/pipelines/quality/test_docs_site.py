"""pipelines.quality.docs_site: every CDN asset of GX's templates has its pinned copy, and the
pages are rewritten to the site's copies (the rendering itself: the Chromium test in
tests/integration/spark/test_quality.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pipelines.quality import docs_site
from pipelines.quality.docs_site import (
    ASSETS,
    ASSETS_DIR,
    make_offline,
    network_assets,
    rewrite_page,
)

TEMPLATES = Path(__import__("great_expectations").__file__).parent / "render" / "view" / "templates"
MODULES = ASSETS_DIR / "node_modules"


def test_every_cdn_asset_of_the_templates_is_known() -> None:
    """A GX upgrade that loads one more file from a CDN fails here, not in a browser."""
    found = set()
    for template in TEMPLATES.glob("*.j2"):
        for tag in re.findall(r"<(?:script|link)\b[^>]*>", template.read_text()):
            found.update(re.findall(r"""(?:src|href)=["'](https?://[^"']+)["']""", tag))
    assert found and found <= set(ASSETS)


def test_every_asset_is_installed() -> None:
    assert [rel for rel in ASSETS.values() if not (MODULES / rel).is_file()] == []


def test_a_page_is_rewritten_to_the_site() -> None:
    page = (
        '<link rel="stylesheet" href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/'
        'bootstrap.min.css"/>\n'
        '<script src="https://code.jquery.com/jquery-3.7.1.min.js" integrity="sha384-x" '
        'crossorigin="anonymous"></script>\n'
        '<script src="https://example.com/new.js"></script>\n'
        '<link rel="shortcut icon" href="../../../static/images/favicon.ico"/>\n'
        '<img src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/'
        'logo-long.png?d=1&dataContextId=abc"/>\n'
        '<a href="https://greatexpectations.io">GX</a>\n'
    )
    html, unknown = rewrite_page(page, to_static="../../../../static")
    assert html == (
        '<link rel="stylesheet" href="../../../../static/vendor/bootstrap/dist/css/'
        'bootstrap.min.css"/>\n'
        '<script src="../../../../static/vendor/jquery/dist/jquery.min.js"></script>\n'
        '<script src="https://example.com/new.js"></script>\n'
        '<link rel="shortcut icon" href="../../../../static/images/favicon.ico"/>\n'
        '<img src="../../../../static/images/logo-long.png"/>\n'
        '<a href="https://greatexpectations.io">GX</a>\n'
    )
    assert unknown == ["https://example.com/new.js"]
    assert network_assets(html) == ["https://example.com/new.js"]
    assert rewrite_page(html, to_static="../../../../static") == (html, unknown)


def test_make_offline_copies_the_assets_and_rewrites_the_pages(tmp_path: Path) -> None:
    site = tmp_path / "site"
    page = site / "validations" / "s" / "run" / "time" / "b.html"
    page.parent.mkdir(parents=True)
    page.write_text('<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>')
    (site / "index.html").write_text('<script src="https://code.jquery.com/jquery-3.7.1.min.js">')
    assert make_offline(site) == []
    assert page.read_text() == '<script src="../../../../static/vendor/vega/build/vega.min.js">' \
        "</script>"  # fmt: skip
    assert (site / "index.html").read_text() == (
        '<script src="static/vendor/jquery/dist/jquery.min.js">'
    )
    for rel in ASSETS.values():
        assert (site / "static" / "vendor" / rel).read_bytes() == (MODULES / rel).read_bytes()
    assert (site / "static/vendor/@fortawesome/fontawesome-free/webfonts/fa-solid-900.woff2")\
        .is_file()  # fmt: skip
    # a later run rewrites only the pages written since it started
    old = site / "old.html"
    old.write_text('<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>')
    os.utime(old, ns=(0, 0))
    assert make_offline(site, since_ns=10**18) == []
    assert "https://" in old.read_text()


def test_missing_assets_name_the_set_up_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(docs_site, "ASSETS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"run tools/bootstrap\.sh"):
        make_offline(tmp_path / "site")
