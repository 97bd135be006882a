# Flink and Spark targets, included by the repository's Makefile (paths relative to the
# repository root). scripts/flink.sh and scripts/spark.sh hold the logic; see their heads.
#   make flink-up          Flink 1.19.0 session cluster on http://127.0.0.1:8081 (2 slots)
#   make flink-jobserver   .cache/jars/beam-runners-flink-1.19-job-server-2.62.0.jar
#   make spark-jobserver   .cache/jars/beam-runners-spark-3-job-server-2.62.0.jar

FLINK_JOBSERVER_JAR := .cache/jars/beam-runners-flink-1.19-job-server-2.62.0.jar
SPARK_JOBSERVER_JAR := .cache/jars/beam-runners-spark-3-job-server-2.62.0.jar

.PHONY: flink-up flink-down flink-status flink-jobserver spark-jobserver

flink-up: ## start the local Flink 1.19.0 cluster on 127.0.0.1:8081, 2 slots (assembled from PyPI files on first run)
	bash scripts/flink.sh up

flink-down: ## stop the local Flink cluster (its home stays in .cache/flink)
	bash scripts/flink.sh down

flink-status: ## show whether the local Flink cluster answers, and its free slots
	@bash scripts/flink.sh status

flink-jobserver: $(FLINK_JOBSERVER_JAR) ## build Beam's Flink job server jar with Maven (deploy/flink/pom.xml; once)

$(FLINK_JOBSERVER_JAR): deploy/flink/pom.xml
	@rm -f $@
	bash scripts/flink.sh jobserver >/dev/null

spark-jobserver: $(SPARK_JOBSERVER_JAR) ## build Beam's Spark 3 job server jar with Maven (deploy/spark/pom.xml; once)

$(SPARK_JOBSERVER_JAR): deploy/spark/pom.xml
	@rm -f $@
	bash scripts/spark.sh jobserver >/dev/null
