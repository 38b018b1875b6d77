"""Checkpoints as the API serves them: listed, reported by jobs, pinned. Deleting the ones nothing
keeps and measuring their sizes run in the dispatcher, beside the storage the Ray nodes write
(api/dispatcher/checkpoint_collector.py, api/dispatcher/checkpoint_sizes.py)."""
