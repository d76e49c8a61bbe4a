"""Adapters that run hcfuse inside other tools' pipelines; each module needs its tool installed.

olive: the fusion as a surgeon of Olive's GraphSurgeries pass (``pip install "hcfuse[olive]"``).
"""
