package brokerlens.jvm;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsAction;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * The local file system ({@code file:}) of brokerlens' sessions: Hadoop's RawLocalFileSystem with
 * Java's file API where Hadoop starts a process. Without Hadoop's native library (pyspark ships
 * none) RawLocalFileSystem runs {@code chmod} for every file and folder it creates and
 * {@code readlink} for both ends of every rename; with Hadoop's default checksummed local file
 * system over it, a {@code .crc} side file is written, and renamed, with each. A Delta commit
 * (its log entry and its checksum, each written to a temporary file and renamed) took 13
 * processes; a small day's daily run about 2,000, each a fork of the driver's JVM.
 *
 * <p>Set as {@code fs.file.impl}; {@link Fs} is the same for FileContext
 * ({@code fs.AbstractFileSystem.file.impl}), which Delta's log store writes the log with.
 */
public class LocalFileSystem extends RawLocalFileSystem {

  /** As {@code chmod}: the permission bits; a sticky bit is left to Hadoop's own. */
  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (permission.getStickyBit()) {
      super.setPermission(p, permission);
      return;
    }
    Set<PosixFilePermission> bits = EnumSet.noneOf(PosixFilePermission.class);
    add(bits, permission.getUserAction(), PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE);
    add(bits, permission.getGroupAction(), PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE);
    add(bits, permission.getOtherAction(), PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);
    Files.setPosixFilePermissions(pathToFile(p).toPath(), bits);
  }

  private static void add(Set<PosixFilePermission> bits, FsAction action, PosixFilePermission read, PosixFilePermission write, PosixFilePermission execute) {
    if (action.implies(FsAction.READ)) bits.add(read);
    if (action.implies(FsAction.WRITE)) bits.add(write);
    if (action.implies(FsAction.EXECUTE)) bits.add(execute);
  }

  /**
   * A path that is no symbolic link has the status {@link #getFileStatus} gives, which is what
   * Hadoop's returns after its {@code readlink} found no link target; a link is left to Hadoop's.
   */
  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f);
  }

  /** {@link LocalFileSystem} for FileContext, as Hadoop's RawLocalFs is RawLocalFileSystem's. */
  public static final class Fs extends DelegateToFileSystem {
    public Fs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new LocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;
    }

    @Override
    public boolean isValidName(String src) {
      return true; // any name the local file system takes, as RawLocalFs
    }
  }
}
