"""Telemetry: per-job reports (and, later, events, journal and exporters)."""

from ._report import CallReport, CallStatus, JobReport, JobStatus, ToolReport

__all__ = ["CallReport", "CallStatus", "JobReport", "JobStatus", "ToolReport"]
