"""``[kafka]`` of conf/pipeline.toml: the jobs' client properties, from a client.properties
file (``command_config``) and/or Kafka's keys written in the section, checked whole by every
job before it starts (exit 2 naming the file and the key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.ingest import load_config
from pipelines.retention.job import load_retention_config
from tests.fixtures.jobs import load_job
from tests.fixtures.tls import make_pki


def test_file_and_inline_keys(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    props = tmp_path / "client.properties"
    props.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
        "sasl.username=lake\nsasl.password=from-file\n"
        f"ssl.truststore.location={pki.ca}\n"
    )
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[kafka]\ncommand_config = "{props}"\n"sasl.mechanism" = "SCRAM-SHA-512"\n'
        '"sasl.password" = "inline"\n"request.timeout.ms" = 2000\n"enable.idempotence" = true\n'
    )
    ingest = load_config(conf, log_dirs=["logs"], lake="lake")
    retention = load_retention_config(conf, log_dirs=["logs"], lake="lake")
    for cfg in (ingest.kafka, retention.kafka):
        assert cfg is not None
        assert (cfg.security_protocol, cfg.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
        assert (cfg.username, cfg.password) == ("lake", "inline")
        assert cfg.request_timeout_s == 2.0 and cfg.trust_pem == pki.ca.read_text()
    shipped = Path(__file__).resolve().parents[3] / "conf" / "pipeline.toml"
    assert load_config(shipped, log_dirs=["logs"], lake="lake").kafka is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[kafka]\n"security.protocl" = "SSL"\n',
         "[kafka] 'security.protocl': each key must be 'command_config' or a Kafka client"
         " property, quoted"),
        ('[kafka]\nsecurity.protocol = "SSL"\n', "[kafka] 'security': each key must be"),
        ('[kafka]\ncommand_confg = "x"\n', "did you mean 'command_config'?"),
        ('[kafka]\n"security.protocol" = "TLS"\n', "security.protocol='TLS': expected one of"),
        ('[kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.mechanism" = "PLAIN"\n',
         "needs a login"),
        ('[kafka]\ncommand_config = "/nonexistent/client.properties"\n',
         "cannot read the client properties /nonexistent/client.properties"),
        ('[kafka]\n"security.protocol" = ["SSL"]\n', "expected a string, a number or a boolean"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("job", ["ingest", "retention", "compact"])
def test_every_job_refuses_a_bad_kafka_section(
    job: str, text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(text)
    assert load_job(job).main(["--config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{job} failed: ") and message in err, err
    assert str(conf) in err
