package io.stsspark.spark;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.apache.spark.resource.ResourceInformation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Keeps a new executor from taking tasks until its GPU's sidecar serves.
 *
 * <p>Spark offers an executor tasks only once its constructor has returned, and the
 * constructor initialises the executor plugins: {@link #executorPlugin()}'s {@code init}
 * asks the driver side for what the pipeline announced (its sidecar settings, JSON, set by
 * {@link #announce(String)}), then runs {@code python -m spark_ext.submit.executor_ready}
 * with it on stdin and the executor's GPU addresses in {@code STS_EXECUTOR_GPUS}, and
 * returns when that exits: the GPU's sidecar is started and serving, the submit path's
 * Python modules read once. A stream's micro-batch never waits for a starting GPU: its
 * tasks stay on the executors that serve until then. Nothing announced (no pipeline with
 * {@code sidecar.launch: lazy} yet), the driver's own executor in local mode, or a run that
 * fails or passes {@code timeout_s}: the executor takes tasks at once, as without the plugin
 * (logged).
 */
public class ExecutorReadyPlugin implements SparkPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(ExecutorReadyPlugin.class);
  /** The announcement in effect on this driver; {@code null}: none. */
  private static volatile String announced = null;
  /** What the driver side answers when nothing is announced. */
  static final String NONE = "";

  /** The pipeline's sidecar settings as the executor-side module reads them (JSON). */
  public static void announce(String spec) {
    announced = spec;
  }

  /** What this driver announced ({@code null}: nothing). */
  public static String announced() {
    return announced;
  }

  @Override
  public DriverPlugin driverPlugin() {
    return new DriverPlugin() {
      @Override
      public Map<String, String> init(SparkContext sc, PluginContext ctx) {
        return Collections.emptyMap();
      }

      @Override
      public Object receive(Object message) {
        String spec = announced;
        return spec == null ? NONE : spec;
      }
    };
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new ExecutorPlugin() {
      @Override
      public void init(PluginContext ctx, Map<String, String> extraConf) {
        if ("driver".equals(ctx.executorID())) {
          return; // local mode: nothing to hold
        }
        String spec;
        try {
          spec = (String) ctx.ask("spec");
        } catch (Exception e) {
          LOG.warn("sts executor ready: could not ask the driver ({}); taking tasks now", e.toString());
          return;
        }
        if (spec == null || spec.isEmpty()) {
          return;
        }
        waitReady(ctx, spec);
      }
    };
  }

  private static void waitReady(PluginContext ctx, String spec) {
    String python = ctx.conf().get("spark.pyspark.python",
        System.getenv().getOrDefault("PYSPARK_PYTHON", "python3"));
    long timeoutS = ctx.conf().getLong("spark.sts.executorReady.timeoutS", 600L);
    List<String> gpus = new ArrayList<>();
    ResourceInformation gpu = ctx.resources().get("gpu");
    if (gpu != null) {
      Collections.addAll(gpus, gpu.addresses());
    }
    ProcessBuilder pb = new ProcessBuilder(python, "-m", "spark_ext.submit.executor_ready");
    pb.environment().put("STS_EXECUTOR_GPUS", String.join(",", gpus));
    pb.environment().put("STS_EXECUTOR_ID", ctx.executorID());
    pb.redirectErrorStream(true);
    pb.redirectOutput(ProcessBuilder.Redirect.INHERIT);
    long started = System.nanoTime();
    try {
      Process proc = pb.start();
      try (java.io.OutputStream in = proc.getOutputStream()) {
        in.write(spec.getBytes(java.nio.charset.StandardCharsets.UTF_8));
      }
      if (!proc.waitFor(timeoutS, TimeUnit.SECONDS)) {
        proc.destroyForcibly();
        LOG.warn("sts executor ready: executor {} not ready after {} s; taking tasks now",
            ctx.executorID(), timeoutS);
        return;
      }
      long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
      if (proc.exitValue() == 0) {
        LOG.info("sts executor ready: executor {} (GPU {}) ready in {} ms", ctx.executorID(),
            String.join(",", gpus), ms);
      } else {
        LOG.warn("sts executor ready: executor {} (GPU {}): the check exited {} after {} ms; "
            + "taking tasks now", ctx.executorID(), String.join(",", gpus), proc.exitValue(), ms);
      }
    } catch (java.io.IOException e) {
      LOG.warn("sts executor ready: could not run {} ({}); taking tasks now", python, e.toString());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
