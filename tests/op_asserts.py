"""The ops' tests' comparison: an error bound relative to the largest reference entry."""
import torch


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    """``|actual - expected| <= tolerance * max|expected|`` everywhere (expected in fp64; 1 for an
    all-zero expected)."""
    scale = expected.abs().max().item() or 1.0
    torch.testing.assert_close(actual.double(), expected, rtol=0, atol=tolerance * scale)
