"""gcp-storage-emulator as `store_servers.gcs_server` runs it: its own command line
(`python -m benchmarks.lib.gcs_emulator start --in-memory ...`), with its media downloads
answering the ``x-goog-generation`` and ``x-goog-metageneration`` headers that GCS sends
with every object's data (https://cloud.google.com/storage/docs/xml-api/reference-headers).

The emulator leaves them out, and tensorstore (Orbax's GCS kvstore) reads an object's
generation from them: without them a read's generation is 0, and the conditional write
that follows it (OCDBT's manifest update after it reads the manifest again) fails with
"Malformed StorageGeneration". Whether OCDBT reads its manifest again depends on timing
(its cached copy must be older than a write's staleness bound), so a checkpoint on the
bare emulator failed now and then, mostly on a loaded machine."""

import sys

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
    """The emulator's media download, with the object's generation headers."""
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
        pass  # the emulator's own download answers 404
    else:
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])
    return _download(request, response, storage, *args, **kwargs)


def patch() -> None:
    """Routes every media download (the JSON API's ``alt=media`` and the download
    endpoints) through `download`."""
    objects.download = download  # objects.get calls it for alt=media
    for _, handlers in server.HANDLERS:
        for method, handler in handlers.items():
            if handler is _download:
                handlers[method] = download


if __name__ == "__main__":
    patch()
    main(sys.argv[1:])
