"""Reading a DCP checkpoint without running code from it.

torch.distributed.checkpoint stores two things with pickle: the ``.metadata`` file (read with
a plain ``pickle.load``) and every non-tensor value in the shard files (read with
``torch.load(weights_only=False)`` by the default load planner). A crafted run dir could
therefore run any command on ``train --resume``. `SafeReader` reads the
metadata through an allow-list unpickler (the DCP metadata classes and the few torch values
they hold) and `SafeLoadPlanner` reads the non-tensor values with ``weights_only=True``;
tensors are already read that way by DCP itself.
"""

from __future__ import annotations

import io
import pathlib
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from shoestring.errors import ShoestringError

# (module, name) pairs a DCP .metadata may name beyond the classes of
# torch.distributed.checkpoint.metadata itself; none of them runs code when called.
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("torch", "device"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: ANN401
        if module == dcp_metadata.__name__:
            value = getattr(dcp_metadata, name, None)
            if isinstance(value, type) and value.__module__ == module:
                return value
        elif (module, name) in _ALLOWED:
            return super().find_class(module, name)
        elif module == "torch" and isinstance(getattr(torch, name, None), _TORCH_VALUES):
            return getattr(torch, name)  # torch.float32, torch.strided, ...
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in DCP metadata")


def read_metadata(data: bytes, where: str) -> Metadata:
    """Unpickle a DCP ``.metadata`` allowing only the classes such a file holds."""
    try:
        value = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 - any damage or foreign content alike
        raise ShoestringError(
            f"refusing the checkpoint's metadata ({type(e).__name__}: {str(e)[:200]})",
            where=where,
            fix="this file is damaged or was not written by torch.distributed.checkpoint; "
            "delete this checkpoint folder to resume from the one before",
        ) from None
    if not isinstance(value, Metadata):
        raise ShoestringError(f"the checkpoint's metadata is a {type(value).__name__}, not DCP "
                              "Metadata", where=where,
                              fix="delete this checkpoint folder to resume from the one before")
    return value


def check_metadata(checkpoint: str | pathlib.Path) -> None:
    """Refuse a checkpoint folder whose ``.metadata`` holds anything but DCP metadata (when it
    has one; DCP reports a missing file itself)."""
    path = pathlib.Path(checkpoint) / ".metadata"
    if path.is_file():
        read_metadata(path.read_bytes(), str(path))


class SafeReader(FileSystemReader):
    """A `FileSystemReader` whose ``.metadata`` goes through the allow-list unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:  # noqa: ANN401
        path = pathlib.Path(self._get_metadata_path(kwargs.get("rank")))
        metadata = read_metadata(path.read_bytes(), str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """The default planner, but non-tensor values (optimizer hyperparameters, step counts)
    are read with ``torch.load(weights_only=True)``: plain numbers, strings and containers."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise ShoestringError(
                f"refusing a value of the checkpoint ({str(e)[:200]})",
                where=read_item.dest_index.fqn,
                fix="the checkpoint holds something other than numbers and text; delete it to "
                "resume from the one before",
            ) from None
        if self.flatten_state_dict:  # where DefaultLoadPlanner.load_bytes puts it
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                        loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
