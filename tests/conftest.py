"""Shared pytest fixtures."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import (transformers pulls it in)


from conftest_s3 import any_s3_server, s3_bucket, s3_server, seaweedfs_server  # noqa: F401  (loopback S3 fixtures)
from hub_cache import hf_home  # noqa: F401
from model_fixtures import default_model_dir, tiny_model_dir  # noqa: F401
from service_stack import service_stack  # noqa: F401  (a live `tokenmill serve` + worker)

import jobs.kinds  # noqa: F401,E402  (the kinds' finder in the pipeline's registry, as every upper floor has it)
