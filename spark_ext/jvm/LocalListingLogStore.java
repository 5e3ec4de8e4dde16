/*
 * sts-spark: Delta's log store for tables on the local file system (file:), listing a
 * table's log by names first.
 *
 * Delta finds a table's newest commits with LogStore.listFrom(<log>/<version>), which for
 * file: (HDFSLogStore) asks Hadoop for the status of every file in _delta_log and keeps
 * those named from <version> on. A streaming table gets one commit per micro-batch and
 * keeps them for delta.logRetentionDuration (30 days), each with Hadoop's hidden .crc beside
 * it, so that listing grows with every commit: ~31 us per file on the machine this was
 * measured on, 0.2 s per append once a table held 3,300 commits (one hour at one commit a
 * second). Here the directory's names are read first (one readdir, no stat) and only the
 * files named from <version> on are stat'ed, as they are consumed: the same files in the
 * same order, for the cost of the few commits after the last checkpoint.
 *
 * Other file systems (hdfs:, s3a:, ...) get HDFSLogStore's own listing. Built by
 * python -m spark_ext.jvm_packages --fetch; set as spark.delta.logStore.file.impl.
 */
package io.stsspark.delta;

import io.delta.storage.HDFSLogStore;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

/** HDFSLogStore with a listFrom that stats only the files it returns, on file:. */
public class LocalListingLogStore extends HDFSLogStore {

  public LocalListingLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public Iterator<FileStatus> listFrom(Path path, Configuration hadoopConf) throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    Path parent = path.getParent();
    File dir;
    if (fs instanceof LocalFileSystem) {  // Hadoop's checksummed local file system
      dir = ((LocalFileSystem) fs).pathToFile(parent);
    } else if (fs instanceof RawLocalFileSystem) {
      dir = ((RawLocalFileSystem) fs).pathToFile(parent);
    } else {
      return super.listFrom(path, hadoopConf);
    }
    String[] names = dir.list();
    if (names == null) {
      if (!dir.isDirectory()) {
        throw new FileNotFoundException("No such file or directory: " + parent);
      }
      throw new IOException("Cannot list " + parent);
    }
    String start = path.getName();
    List<String> from = new ArrayList<>();
    for (String name : names) {
      if (name.compareTo(start) >= 0 && !isChecksumFile(name)) {
        from.add(name);
      }
    }
    Collections.sort(from);
    return new StatusIterator(fs, parent, from.iterator());
  }

  /** Hadoop's checksum of a file, ".<name>.crc": never part of a listing (as in Hadoop's). */
  private static boolean isChecksumFile(String name) {
    return name.startsWith(".") && name.endsWith(".crc");
  }

  /** The statuses of the named files, stat'ed one by one; a file gone since is skipped. */
  private static final class StatusIterator implements Iterator<FileStatus> {
    private final FileSystem fs;
    private final Path parent;
    private final Iterator<String> names;
    private FileStatus next;

    StatusIterator(FileSystem fs, Path parent, Iterator<String> names) {
      this.fs = fs;
      this.parent = parent;
      this.names = names;
      this.next = advance();
    }

    private FileStatus advance() {
      while (names.hasNext()) {
        try {
          return fs.getFileStatus(new Path(parent, names.next()));
        } catch (FileNotFoundException gone) {
          // removed since the listing (the log's cleanup): not listed, as if listed later
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      }
      return null;
    }

    @Override
    public boolean hasNext() {
      return next != null;
    }

    @Override
    public FileStatus next() {
      if (next == null) {
        throw new NoSuchElementException();
      }
      FileStatus current = next;
      next = advance();
      return current;
    }
  }
}
