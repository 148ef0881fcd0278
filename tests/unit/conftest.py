import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "phalanx", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("fuzz", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "phalanx"))
