"""A random generator whose draws a test writes down, shared by the MLM/CPC masking tests."""

import numpy as np


class ScriptedRng:
    """`choice` returns the next scripted pick, `random` the next scripted uniforms: the whole
    mask a test expects is then known by hand."""

    def __init__(self, picks: list, uniforms: list):
        self.picks, self.uniforms = list(picks), list(uniforms)

    def choice(self, population, size=None, replace=True):
        return np.asarray(self.picks.pop(0))

    def random(self, size=None):
        if size is None:
            return self.uniforms.pop(0)
        out, self.uniforms = np.asarray(self.uniforms[:size]), self.uniforms[size:]
        return out
