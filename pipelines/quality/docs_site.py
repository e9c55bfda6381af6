"""Data Docs that render offline: the CDN assets of Great Expectations' pages, served by the site.

Great Expectations' page templates (``render/view/templates/*.j2``) load jQuery, Bootstrap,
bootstrap-table, Font Awesome, Vega... from public CDNs. The validation lists of the index
page are drawn by bootstrap-table in JavaScript, so a browser without network shows an index
with no validation at all (and unstyled pages). Here the same files, pinned by
``docs_assets/package-lock.json`` and installed by ``tools/bootstrap.sh`` (``npm ci``), are
copied into the site (``static/vendor/<npm package>/<path>``) and every page's CDN URL is
rewritten to a relative path to its copy. Nothing is downloaded at run time.

Why rewrite the HTML and not the templates: GX puts its own template loader before a site's
``custom_views_directory`` (``DefaultJinjaView``), so a site cannot override the templates.
The ``integrity``/``crossorigin`` attributes go with the URL: from ``file://`` a
``crossorigin`` script is a CORS request that Chromium refuses.

Idempotent: a page already rewritten has no CDN URL left; copies whose size matches are kept.
A crash between the copy and the rewrite leaves pages that still load from the CDNs (the next
run rewrites them: pages are chosen by modification time, and every page when the site's
marker ``static/vendor/.loglake-assets`` does not name the current lock file's hash).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

__all__ = ["ASSETS", "ASSETS_DIR", "VENDOR_DIR", "make_offline", "network_assets", "rewrite_page"]

ASSETS_DIR = Path(__file__).resolve().parent / "docs_assets"
VENDOR_DIR = "static/vendor"  # GX copies its own static/ (fonts, images, styles) there
_MARKER = ".loglake-assets"

# CDN URL in GX 1.24's templates -> the same file in the pinned npm packages
ASSETS: dict[str, str] = {
    "https://cdn.jsdelivr.net/npm/vega@5": "vega/build/vega.min.js",
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite/build/vega-lite.min.js",
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed/build/vega-embed.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css":
        "@fortawesome/fontawesome-free/css/all.min.css",
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery/dist/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js":
        "popper.js/dist/umd/popper.min.js",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js":
        "bootstrap/dist/js/bootstrap.min.js",
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css":
        "bootstrap/dist/css/bootstrap.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js":
        "bootstrap-table/dist/bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css":
        "bootstrap-table/dist/bootstrap-table.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.min.js":
        "bootstrap-table/dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    # the templates take these two from 1.19.0; 1.19.1's are the same rules
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.min.css":
        "bootstrap-table/dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
    "bootstrap-table-filter-control.css":
        "bootstrap-table/dist/extensions/filter-control/bootstrap-table-filter-control.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/"
    "bootstrap-datepicker.min.js": "bootstrap-datepicker/dist/js/bootstrap-datepicker.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/"
    "bootstrap-datepicker.min.css": "bootstrap-datepicker/dist/css/bootstrap-datepicker.min.css",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/"
    "bootstrap-prefers-dark.css": "@forevolve/bootstrap-dark/dist/css/bootstrap-prefers-dark.css",
}  # fmt: skip
# directories the assets refer to (Font Awesome's CSS: url(../webfonts/...))
_ASSET_DIRS = ("@fortawesome/fontawesome-free/webfonts",)

_TAG = re.compile(r"<(?:script|link)\b[^>]*>", re.IGNORECASE)
_URL = re.compile(r"""(src|href)=(["'])(https?://[^"']+)\2""", re.IGNORECASE)
_STATIC = re.compile(r"""(src|href)=(["'])(?:\./|(?:\.\./)+)static/([^"']+)\2""", re.IGNORECASE)
_SRI = re.compile(r"""\s+(?:integrity|crossorigin)=(["'])[^"']*\1""", re.IGNORECASE)
# GX's logo in the pages' header (an <img> with the context's id in its query string, and a
# CSS background): the site's own copy (GX ships logo-long.png in the site's static/images)
_LOGO = re.compile(
    r"https://great-expectations-web-assets\.s3\.[\w.-]+\.amazonaws\.com/[\w.-]+(?:\?[^\"'()\s]*)?"
)


def _lock_hash() -> str:
    lock = ASSETS_DIR / "package-lock.json"
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:16] if lock.is_file() else "none"


def _copy_assets(modules: Path, vendor: Path) -> None:
    files = [(modules / rel, vendor / rel) for rel in ASSETS.values()]
    for d in _ASSET_DIRS:
        files += [(src, vendor / d / src.name) for src in (modules / d).iterdir()]
    for src, dst in files:
        if dst.is_file() and dst.stat().st_size == src.stat().st_size:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(dst)


def rewrite_page(html: str, *, to_static: str) -> tuple[str, list[str]]:
    """``html`` with every known CDN URL of a ``<script>``/``<link>`` tag replaced by
    ``<to_static>/vendor/<path>`` (``to_static``: the site's ``static`` directory, relative to
    the page) and that tag's ``integrity`` and ``crossorigin`` dropped, and GX's logo taken
    from the site; and the CDN URLs left (unknown to :data:`ASSETS`)."""
    unknown: list[str] = []
    to_vendor = f"{to_static}/vendor"

    def tag(match: re.Match[str]) -> str:
        text = match.group(0)
        url = _URL.search(text)
        if url is None:
            # GX counts the directories of a validation page one short (favicon.j2: the
            # suite's dots + 3; a page is 4 deep): the site's static files from the page
            return _STATIC.sub(lambda m: f"{m[1]}={m[2]}{to_static}/{m[3]}{m[2]}", text)
        rel = ASSETS.get(url.group(3))
        if rel is None:
            unknown.append(url.group(3))
            return text
        quote = url.group(2)
        text = text.replace(url.group(0), f"{url.group(1)}={quote}{to_vendor}/{rel}{quote}")
        return _SRI.sub("", text)

    html = _LOGO.sub(f"{to_static}/images/logo-long.png", html)
    return _TAG.sub(tag, html), unknown


def network_assets(html: str) -> list[str]:
    """The http(s) URLs of a page's ``<script>`` and ``<link>`` tags: what it would load from
    the network (none, once :func:`make_offline` rewrote it)."""
    return [m[3] for tag in _TAG.findall(html) if (m := _URL.search(tag))]


def _pages(site: Path, since_ns: int) -> Iterable[Path]:
    for dirpath, _, names in os.walk(site):
        for name in names:
            if name.endswith(".html"):
                path = Path(dirpath) / name
                if path.stat().st_mtime_ns >= since_ns:
                    yield path


def make_offline(site: Path, *, since_ns: int = 0) -> list[str]:
    """Copy the assets into ``site`` and rewrite its pages modified at or after ``since_ns``
    (every page when the site's assets are older than the lock file or absent). Returns the
    CDN URLs that stayed (unknown ones: a GX upgrade added an asset; the pages still load
    those from the network). Raises ``FileNotFoundError`` naming ``tools/bootstrap.sh`` when
    the npm packages are not installed."""
    modules = ASSETS_DIR / "node_modules"
    missing = [rel for rel in ASSETS.values() if not (modules / rel).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Data Docs assets not installed under {modules} ({missing[0]} and "
            f"{len(missing) - 1} more): run tools/bootstrap.sh (npm ci)"
        )
    vendor = site / VENDOR_DIR
    marker = vendor / _MARKER
    version = _lock_hash()
    if not marker.is_file() or marker.read_text(encoding="utf-8") != version:
        since_ns = 0
    _copy_assets(modules, vendor)
    # mtime granularity: a page written just before since_ns may carry an earlier stamp
    since_ns = max(0, since_ns - 2_000_000_000)
    unknown: set[str] = set()
    for page in _pages(site, since_ns):
        html = page.read_text(encoding="utf-8")
        to_static = os.path.relpath(site / "static", page.parent).replace(os.sep, "/")
        new, left = rewrite_page(html, to_static=to_static)
        unknown.update(left)
        if new != html:
            tmp = page.with_name(page.name + ".tmp")
            tmp.write_text(new, encoding="utf-8")
            tmp.replace(page)
    marker.write_text(version, encoding="utf-8")
    return sorted(unknown)
