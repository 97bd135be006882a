# Flink and Spark targets, included by the repository's Makefile (paths relative to the
# repository root). scripts/flink.sh and scripts/spark.sh hold the logic; see their heads.
#   make flink-up          Flink 1.19.0 session cluster on http://127.0.0.1:8081: a JobManager,
#                          2 TaskManagers (2 slots each), an SDK worker pool, a standing job server
#   make flink-jobserver   .cache/jars/beam-runners-flink-1.19-job-server-2.62.0.jar
#   make spark-jobserver   .cache/jars/beam-runners-spark-3-job-server-2.62.0.jar

# The runner versions come from deploy/versions.env (read by the Makefile before this include);
# scripts/flink.sh and scripts/spark.sh read the same file, and pass them to Maven as -D.
FLINK_JOBSERVER_JAR := .cache/jars/beam-runners-flink-$(FLINK_MINOR)-job-server-$(BEAM_FLINK_RUNNER_VERSION).jar
SPARK_JOBSERVER_JAR := .cache/jars/beam-runners-spark-3-job-server-$(BEAM_SPARK_RUNNER_VERSION).jar
ifeq ($(BEAM_FLINK_RUNNER_VERSION)$(FLINK_MINOR),)
$(error deploy/flink/targets.mk needs BEAM_FLINK_RUNNER_VERSION and FLINK_MINOR from deploy/versions.env)
endif

.PHONY: flink-up flink-down flink-status flink-jobserver spark-jobserver

flink-up: $(FLINK_JOBSERVER_JAR) ## start the local Flink 1.19.0 cluster on 127.0.0.1:8081: JobManager, 2 TaskManagers, SDK worker pool, job server
	bash scripts/flink.sh up

flink-down: ## stop the local Flink cluster, its worker pool and job server (its home stays in .cache/flink)
	bash scripts/flink.sh down

flink-status: ## show whether the local Flink cluster answers, and its free slots
	@bash scripts/flink.sh status

flink-jobserver: $(FLINK_JOBSERVER_JAR) ## build Beam's Flink job server jar with Maven (deploy/flink/pom.xml; once)

# Order-only on the pom: the jar's name carries its versions, so a new version builds a new jar,
# and editing the pom never deletes a jar that a running job may be using.
$(FLINK_JOBSERVER_JAR): | deploy/flink/pom.xml
	bash scripts/flink.sh jobserver >/dev/null

spark-jobserver: $(SPARK_JOBSERVER_JAR) ## build Beam's Spark 3 job server jar with Maven (deploy/spark/pom.xml; once)

$(SPARK_JOBSERVER_JAR): | deploy/spark/pom.xml
	bash scripts/spark.sh jobserver >/dev/null
