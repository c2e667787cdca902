from tests.kafka_fixtures import (_local_cluster, group_id, kafka, kafka_bootstrap, kafka_cluster,  # noqa: F401
                                  topics)
