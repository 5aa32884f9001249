"""The GPU engine: node discovery, request parsing, planning and in-namespace actions.

Independent of NRI and of ``plugin`` (never imports it): the plugin turns NRI
messages into engine calls and engine plans into NRI adjustments.
"""
