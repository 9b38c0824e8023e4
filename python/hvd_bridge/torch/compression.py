"""Gradient compression for allreduce (Horovod's Compression): a compressor's compress(tensor)
returns (tensor to send, context) and decompress(tensor, context) undoes it."""
import torch


class Compressor:
    """The interface: static compress and decompress."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and casts the result back."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    """Horovod's names: Compression.none, Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
