from tests.kafka_fixtures import group_id, kafka, kafka_bootstrap, topics  # noqa: F401  (fixtures)
