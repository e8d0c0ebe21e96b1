"""Download one file: descriptive User-Agent, a progress bar, and an atomic rename at the end.

A killed download leaves no half file under the final name (the bytes go to a temporary file
beside it), so the next resolution never mistakes a fragment for the data.

    python -m pipeline data fetch prompts     # uses this under the hood
"""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from pipeline import __version__
from pipeline.core.errors import PipelineError
from pipeline.core.storage import atomic_path, check_writable_dir, remove_stale_temps

USER_AGENT = (
    f"react-finetune-pipeline/{__version__} "
    "(research reproduction of ReAct fine-tuning on HotpotQA; python-urllib)"
)
CHUNK = 1 << 20


def download(url: str, dest: str | os.PathLike, *, timeout: float = 60.0, quiet: bool = False) -> Path:
    """Fetch `url` into `dest` (parents created) and return `dest`; PipelineError if unreachable."""
    from tqdm.auto import tqdm

    dest = Path(dest)
    check_writable_dir(dest.parent, "data folder")
    remove_stale_temps(dest.parent, dest.name)  # an earlier download that was killed
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response, atomic_path(dest) as tmp:
            total = int(response.headers.get("Content-Length") or 0) or None
            with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True,
                                              desc=f"download {dest.name}", disable=quiet) as bar:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    bar.update(len(chunk))
            got = tmp.stat().st_size
            if total is not None and got != total:
                raise PipelineError(f"download of {url} was cut short ({got} of {total} bytes); run it again")
    except urllib.error.HTTPError as exc:
        raise PipelineError(f"could not download {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise PipelineError(f"could not download {url}: {exc.reason} (no network?)") from None
    except http.client.IncompleteRead as exc:
        raise PipelineError(f"download of {url} was cut short ({len(exc.partial)} bytes, "
                            f"{exc.expected} more expected); run it again") from None
    except (TimeoutError, ConnectionError, http.client.HTTPException) as exc:
        raise PipelineError(f"could not download {url}: {exc or type(exc).__name__}") from None
    return dest
