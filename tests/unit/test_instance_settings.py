"""An instance's settings file (/etc/gptoss-spark/NAME.toml, gptoss-spark@NAME) against the default
service's: its own state dir, ports and served name, the same memory.claims_dir (service/instance.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_spark.base.defaults import DEFAULT_CONFIG_PATH
from gptoss_spark.base.errors import ConfigError
from gptoss_spark.service.config import Settings
from gptoss_spark.service.budget import MemoryBudget
from gptoss_spark.service.instance import check_instance, instance_name, service_name

OWN = {"model": {"served_name": "gpt-oss-20b"}, "engine": {"port": 8110}, "admin": {"port": 8111},
       "paths": {"state_dir": "/var/lib/gptoss-spark/20b"}}


def test_only_a_file_beside_the_default_s_is_an_instance_s():
    assert instance_name(Path("/etc/gptoss-spark/20b.toml")) == "20b"
    assert instance_name(DEFAULT_CONFIG_PATH) is None
    assert instance_name(Path("/tmp/20b.toml")) is None
    assert instance_name(Path("/etc/gptoss-spark/profiles/plain.toml")) is None


def check(tmp_path: Path, data: dict, default: str = "") -> None:
    (tmp_path / "default.toml").write_text(default)
    check_instance(Settings.model_validate(data), Path("/etc/gptoss-spark/20b.toml"),
                   default_config=tmp_path / "default.toml")


def test_an_instance_with_its_own_state_ports_and_name_passes(tmp_path):
    check(tmp_path, OWN)
    check(tmp_path, {**OWN, "memory": {"claims_dir": "/var/lib/gptoss-spark/claims"}},
          '[memory]\nclaims_dir = "/var/lib/gptoss-spark/claims"\n')


@pytest.mark.parametrize("section,values,default,message", [
    ("paths", {"state_dir": "/var/lib/gptoss-spark"}, "",
     "/etc/gptoss-spark/20b.toml: paths.state_dir: is /var/lib/gptoss-spark, but the unit gptoss-spark@20b gives "
     "this instance /var/lib/gptoss-spark/20b (the others are another service's); set state_dir = "
     '"/var/lib/gptoss-spark/20b" in [paths]'),
    ("admin", {"port": 8101}, "", "/etc/gptoss-spark/20b.toml: admin.port: 8101 is the default service's too"),
    ("engine", {"port": 9000}, "[admin]\nport = 9000\n", "engine.port: 9000 is the default service's too"),
    ("model", {"served_name": "gptoss"}, "", "model.served_name: 'gptoss' is the default service's too"),
    ("memory", {"claims_dir": "/srv/claims"}, "",
     "memory.claims_dir: is /srv/claims, the default service's is /var/lib/gptoss-spark/claims"),
])
def test_an_instance_sharing_the_default_s_state_port_or_name_is_refused(tmp_path, section, values, default, message):
    with pytest.raises(ConfigError) as e:
        check(tmp_path, {**OWN, section: {**OWN.get(section, {}), **values}}, default)
    assert message in str(e.value)


def test_an_instance_named_like_a_directory_of_the_default_s_is_refused(tmp_path):
    (tmp_path / "default.toml").write_text("")
    with pytest.raises(ConfigError) as e:
        check_instance(Settings.model_validate({**OWN, "paths": {"state_dir": "/var/lib/gptoss-spark/claims"}}),
                       Path("/etc/gptoss-spark/claims.toml"), default_config=tmp_path / "default.toml")
    assert "the instance name 'claims' is a directory of the default service's (/var/lib/gptoss-spark/claims)" \
        in str(e.value)


def test_every_installed_service_shares_one_claims_dir_with_no_setting():
    """The default's state dir and each instance's (its own, below it) lead to one claims directory, so
    two models budget each other out of the box; a service whose state is elsewhere keeps its own."""
    assert Settings().claims_dir == Path("/var/lib/gptoss-spark/claims")
    assert Settings.model_validate(OWN).claims_dir == Path("/var/lib/gptoss-spark/claims")
    assert Settings.model_validate({"paths": {"state_dir": "/tmp/x/state"}}).claims_dir == Path("/tmp/x/state/claims")
    assert Settings.model_validate({**OWN, "memory": {"claims_dir": "/srv/c"}}).claims_dir == Path("/srv/c")


def test_a_claim_is_the_unit_s_so_two_instances_serving_one_name_keep_two_claims(tmp_path):
    """Keyed by the served name, the second instance's claim would overwrite the first's and the budget
    would count one model where two run."""
    assert service_name(Path("/var/lib/gptoss-spark")) == "gptoss-spark"
    assert service_name(Path("/var/lib/gptoss-spark/20b")) == "gptoss-spark@20b"
    assert service_name(Path("/tmp/x/state")) == "/tmp/x/state"
    for name in ("20b", "20b-b"):  # both serve "gpt-oss-20b" (OWN's served_name), on their own ports
        MemoryBudget(tmp_path, service_name(Path(f"/var/lib/gptoss-spark/{name}"))).claim("plain-20b", 24)
    seen = MemoryBudget(tmp_path, service_name(Path("/var/lib/gptoss-spark"))).others()
    assert sorted(c.instance for c in seen) == ["gptoss-spark@20b", "gptoss-spark@20b-b"]
