"""``python -m stream_processors``: run the stream worker (see `stream_processors.worker.main`)."""

from stream_processors.worker import main

main()
