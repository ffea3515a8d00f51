package brokerlens.jvm

import java.util.concurrent.CountDownLatch

import org.apache.spark.scheduler.{SparkListener, SparkListenerApplicationEnd}
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.connect.service.SparkConnectService

/**
 * Spark's Connect server (as `org.apache.spark.sql.connect.service.SparkConnectServer` starts
 * it), with its clients' sessions sharing one class loader.
 *
 * Spark's own main turns on `spark.sql.artifact.isolation.enabled` and
 * `spark.sql.artifact.isolation.alwaysApplyClassloader` for every session, whatever the
 * application's settings say. Each session then runs its queries under a class loader of its
 * own, on the driver and on the executors, and Spark's cache of generated code is keyed by class
 * loader: every new session compiles each of its queries' classes again, and the JIT starts
 * them cold. A daily stage is a new session, so each paid that again (a demo day in a new
 * session: 139 to 149 s, against 91 to 109 s with the loader shared). brokerlens' clients add
 * no artifacts (no JARs, files or classes of their own) for isolation to keep apart.
 */
object ConnectServer {
  def main(args: Array[String]): Unit = {
    val session = SparkSession.builder()
      .config("spark.sql.artifact.isolation.enabled", false)
      .config("spark.sql.artifact.isolation.alwaysApplyClassloader", false)
      .getOrCreate()
    val ended = new CountDownLatch(1)
    session.sparkContext.addSparkListener(new SparkListener {
      override def onApplicationEnd(end: SparkListenerApplicationEnd): Unit = ended.countDown()
    })
    SparkConnectService.start(session.sparkContext)
    // Serves until the application ends: stopped by its pid, Spark's shutdown hook ends it.
    ended.await()
  }
}
