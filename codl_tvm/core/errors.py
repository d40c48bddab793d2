"""The error hierarchy of codl-tvm.

Every error the library raises for an expected failure (bad input, a model it cannot use, a
device that cannot build or run, a malformed file) derives from :class:`CodlError`. The CLI's
``main()`` catches :class:`CodlError` once and prints its message as one line
(``codl-tvm: error: ...``, exit status 2); anything else is a bug and keeps its traceback.

Each class also keeps the builtin base it had before the hierarchy existed (``ValueError`` or
``RuntimeError``) as a mixin, so callers that catch the builtin keep working.

This module imports nothing from the package: every other module may import it.
"""

from __future__ import annotations

__all__ = [
    "ArtifactError",
    "BuildError",
    "CliError",
    "CodlError",
    "DatasetError",
    "DeployError",
    "DeviceSupportError",
    "FeatureError",
    "ImageError",
    "ModelError",
    "ModelFileError",
    "NoDefaultModelError",
    "NoFreeDevice",
    "PlanError",
    "PlannerError",
    "PresetError",
    "ProfileError",
    "RPCError",
    "RefineError",
    "RemoteFailure",
    "ToolchainError",
    "TrackerUnreachable",
    "VersionMismatch",
]


class CodlError(Exception):
    """Base of every expected failure of codl-tvm; its message is one line meant for the user."""


class CliError(CodlError):
    """Bad command-line usage (a flag value, a missing file); printed as one line, exit status 2."""


class ModelError(CodlError, ValueError):
    """A model file or its inputs cannot be used; the message names the file and the problem."""


class PlanError(CodlError, ValueError):
    """A plan is malformed or does not fit the module; the message names the entry and problem."""


class PlannerError(CodlError, ValueError):
    """The planner cannot run (bad configuration, a cost model it cannot use)."""


class RefineError(CodlError, ValueError):
    """The timelines or the build's kernel record cannot refine the plan."""


class ArtifactError(CodlError, ValueError):
    """An artifact cannot be written or read; the message names the path and the problem."""


class ProfileError(CodlError, ValueError):
    """A profiling job cannot be built or measured (the message names the operator and part)."""


class DatasetError(CodlError, ValueError):
    """A dataset file or record is malformed (the message names file, line and field)."""


class ModelFileError(CodlError, ValueError):
    """A model file is unreadable, not a cost model, of another version or kind, or corrupt."""


class NoDefaultModelError(CodlError, ValueError):
    """No shipped cost model describes the requested device pair."""


class FeatureError(CodlError, ValueError):
    """Invalid operator description (names the operator, the field and the value)."""


class PresetError(CodlError, KeyError):
    """No target preset has the requested name; the message lists the valid names."""

    def __str__(self) -> str:
        # KeyError quotes its message as a repr; this one is meant to be read
        return str(self.args[0]) if self.args else ""


class ToolchainError(CodlError, RuntimeError):
    """The compiler or linker needed to export a library for a preset is not available."""


class BuildError(CodlError, RuntimeError):
    """TVM could not build a model for a device (an OpenCL kernel that does not compile, a pass
    that fails); the message names the model, the operator or kernel and the device."""


class ImageError(CodlError, ValueError):
    """An image cannot be allocated or used: the device has no images, the tensor exceeds the
    device's image limits, or the scope, shape, dtype or region does not fit an image."""


class DeviceSupportError(CodlError, ValueError):
    """The device lacks what a build was asked for: OpenCL images, images as large as the
    model's tensors, or ``cl_khr_fp16``. The message names the device and the missing
    extension or limit.

    Attributes
    ----------
    fields
        The options fields that asked for it (a command line names its flags instead).
    """

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


class DeployError(CodlError, RuntimeError):
    """The deployment cannot proceed; the message names the problem."""


class RPCError(CodlError, RuntimeError):
    """Base class of codl-tvm's RPC errors."""


class TrackerUnreachable(RPCError):
    """The tracker does not answer at its address."""


class NoFreeDevice(RPCError):
    """The tracker has no free device of the requested key within the wait."""


class VersionMismatch(RPCError):
    """The remote runs a TVM other than this machine's."""


class RemoteFailure(RPCError):
    """A connected remote device failed (died, timed out, or raised); names the device."""

    def __init__(self, device: str, stage: str, detail: str) -> None:
        super().__init__(f"remote device {device} failed while {stage}: {detail}")
        self.device = device
        self.stage = stage
