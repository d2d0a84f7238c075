"""``[model] tensor_parallel_size`` reaches the engine settings; a bad value fails at load time."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobs import JobSpec
from jobs.spec_errors import format_errors

BASE = {"name": "t", "input": {"url": "/data/in/"}, "output": {"url": "/data/out/"}}


def test_tensor_parallel_size_is_an_engine_setting():
    spec = JobSpec.from_dict(BASE | {"model": {"tensor_parallel_size": 2}})
    assert spec.to_plan("x").engine_settings == {"model": "smollm2-135m-instruct", "tensor_parallel_size": 2}


def test_a_plan_without_it_keeps_its_settings():
    assert JobSpec.from_dict(BASE).to_plan("x").engine_settings == {"model": "smollm2-135m-instruct"}


def test_zero_ranks_is_refused_with_its_path():
    with pytest.raises(ValidationError) as info:
        JobSpec.from_dict(BASE | {"model": {"tensor_parallel_size": 0}})
    assert format_errors(info.value, JobSpec) == [
        "model.tensor_parallel_size: Input should be greater than or equal to 1"]
