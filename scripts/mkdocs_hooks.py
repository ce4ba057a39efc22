"""MkDocs hook of the documentation site (mkdocs.yml: hooks).

The pages live in docs/ and link to files of the repository outside it
(``../../examples/camera_frames.py``), so that the links also work where
the markdown is read as it is (a clone, a code host). MkDocs only knows
the files under docs/: this hook copies each such linked file into the
site under ``repo/`` and points the link there. A link to a file that does
not exist is a warning, so ``mkdocs build --strict`` fails on it.
"""
import logging
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.kickmsg")
ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
linked: set[str] = set()  # repository paths (relative to ROOT) that pages link to


def outside_target(page_path: str, target: str, docs_dir: Path) -> str | None:
    """The repository path a relative link leads to, when it leaves docs/."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    resolved = (docs_dir / page_path).parent / target
    try:
        relative = resolved.resolve().relative_to(ROOT)
    except ValueError:
        return None
    if relative.parts and relative.parts[0] == docs_dir.name:
        return None
    return relative.as_posix()


def on_page_markdown(markdown, page, config, files):
    docs_dir = Path(config["docs_dir"])

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        path = outside_target(page.file.src_uri, target, docs_dir)
        if path is None:
            return match.group(0)
        if not (ROOT / path).is_file():
            log.warning("%s links to %s, which is not a file of the repository", page.file.src_uri, target)
            return match.group(0)
        linked.add(path)
        here = posixpath.dirname(page.file.src_uri)
        return match.group(1) + posixpath.relpath(f"repo/{path}", here or ".") + match.group(3)

    return LINK.sub(rewrite, markdown)


def on_files(files: Files, config) -> Files:
    """Every file under examples/ may be linked: offer them all to the site
    (only those linked are worth a look, but pages are read after this)."""
    for path in sorted((ROOT / "examples").glob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        files.append(File.generated(config, f"repo/{relative}", abs_src_path=str(path)))
    return files
