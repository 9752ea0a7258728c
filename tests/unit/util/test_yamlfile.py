import pytest
import yaml

from dpstudy.study.schema import SCHEMA_PATH
from dpstudy.util import yamlfile


def test_the_study_schema_reads_the_same_with_libyaml_as_in_pure_python():
    assert yaml.__with_libyaml__ and yamlfile.SAFE_LOADER is yaml.CSafeLoader  # the lock's PyYAML wheel
    text = SCHEMA_PATH.read_text()
    assert yamlfile.safe_load(text) == yaml.safe_load(text)


def test_it_stays_safe():
    with pytest.raises(yaml.constructor.ConstructorError):
        yamlfile.safe_load("!!python/object/apply:os.system ['true']")
    assert yamlfile.safe_load("a: [1, 2.5, yes, null, 2026-11-29]") == yaml.safe_load(
        "a: [1, 2.5, yes, null, 2026-11-29]"
    )
