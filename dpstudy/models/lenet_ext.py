"""LeNet of source 000 computed with dpstudy's own conv2d and max_pool2d (source 002, task 3)."""

from __future__ import annotations

from dpstudy.models.lenet import LeNet


class LeNetExt(LeNet):
    """LeNet with the extension's operators: same architecture, parameters and state_dict keys,
    so weights move freely between the two. Building it loads (or first builds) the extension
    from $DPSTUDY_EXT_DIR or results/ext."""

    def __init__(self, channels: int, size: int, classes: int = 10):
        super().__init__(channels, size, classes)
        # Imported here: loading the extension may build it, which only this model needs.
        from dpstudy.ext.layers import convert

        convert(self.features)
