"""An instance's settings file (/etc/gptoss-spark/NAME.toml, gptoss-spark@NAME) against the default
service's: its own state dir, ports and served name, the same memory.claims_dir (service/instance.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_spark.base.defaults import DEFAULT_CONFIG_PATH
from gptoss_spark.base.errors import ConfigError
from gptoss_spark.service.config import Settings
from gptoss_spark.service.instance import check_instance, instance_name

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
    ("memory", {"claims_dir": "/var/lib/gptoss-spark/claims"}, "",
     "memory.claims_dir: is /var/lib/gptoss-spark/claims, the default service's is None"),
])
def test_an_instance_sharing_the_default_s_state_port_or_name_is_refused(tmp_path, section, values, default, message):
    with pytest.raises(ConfigError) as e:
        check(tmp_path, {**OWN, section: {**OWN.get(section, {}), **values}}, default)
    assert message in str(e.value)
