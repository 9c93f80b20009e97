// WebDataset tar shards (data.format: webdataset): the format webdataset's writers produce
// (tarfile, webdataset.TarWriter/ShardWriter): each sample is a run of consecutive members that
// share a key, the member's path up to the first '.' of its file name ("n01440764/img_0007.jpg"
// and "n01440764/img_0007.cls" are the sample "n01440764/img_0007" with members "jpg" and "cls").
//
// Shards are read by index, not streamed: index_webdataset reads only the 512-byte member
// headers of each shard (and the small label members), then the images are read where they lie
// in the shard when a batch needs them (as webdataset's indexed reader, wids, does). So every
// loader semantic of the other formats holds: the rank partition and per-epoch reshuffle of
// DistributedSampler over all samples of all shards, any number of loader threads, and a
// resumed run that continues with exactly the batches (and random crops) of the uninterrupted
// one. WebDataset's streamed order (each rank reading its part of the epoch's shard order front
// to back through a shuffle buffer) is DataLoaderOptions::shuffle_buffer (fabric/data/sampler.h,
// StreamSampler); its reads are still preads of indexed members, so shards without random access
// (pipes, .tar.gz) are not read.
//
// Example:
//   auto shards = fabric::expand_braces("data/train-{000..099}.tar");
//   auto train = fabric::ImageFolderDataset::from_webdataset(shards, options);  // image_folder.h
#ifndef FABRIC_DATA_WEBDATASET_H_
#define FABRIC_DATA_WEBDATASET_H_

#include <cstdint>
#include <string>
#include <vector>

namespace fabric {

// Brace expansion as webdataset's shard lists use it (the braceexpand package): "{000..099}" is
// 000, 001, ..., 099 (zero-padded to the width of the bounds when they are equally wide or
// start with 0; descending when the first is larger), "{a,b,c}" the alternatives, several braces
// their product, in order. Throws fabric::Error "PATTERN: ..." for an unmatched brace or more
// than 1,000,000 names.
std::vector<std::string> expand_braces(const std::string& pattern);

// A regular file inside a tar archive: `size` bytes at byte `offset` of the archive.
struct TarMember {
  std::string name;  // ustar prefix/name, GNU long names and pax "path" records applied
  int64_t offset = 0;
  int64_t size = 0;
};

// The regular files of a tar archive (ustar, GNU and pax headers; directories, links and other
// entries skipped), reading only the headers. Throws fabric::Error naming `path` for an
// unreadable file, a header whose checksum is wrong (not a tar file, or damaged), a size field
// that is not a number, or a member that runs past the end of the file (truncated).
std::vector<TarMember> list_tar(const std::string& path);

// One sample of a shard: its key and members by extension ("jpg", "cls", "seg.png").
struct WebDatasetSample {
  size_t shard = 0;  // index into the shard list
  std::string key;
  std::vector<std::pair<std::string, TarMember>> members;  // extension, member
};

// The samples of `shards`, in shard order then member order; consecutive members with the same
// key form one sample (a key met again later starts another sample, as webdataset does).
// Members without an extension and hidden files (".*") are skipped. Throws fabric::Error naming
// the shard (list_tar's errors; "no samples").
std::vector<WebDatasetSample> index_webdataset(const std::vector<std::string>& shards);

// `size` bytes at `offset` of `path` (a tar member's data). Throws fabric::Error "NAME: ..."
// (NAME: how errors name the member) when the file cannot be read or is shorter.
std::string read_file_range(const std::string& path, int64_t offset, int64_t size,
                            const std::string& name);

}  // namespace fabric

#endif  // FABRIC_DATA_WEBDATASET_H_
