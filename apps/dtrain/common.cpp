// What several subcommands share: the config arguments and loading each data set once.
#include "commands.hpp"

namespace dtrain::cli {

void add_config_arguments(CLI::App& app, std::string& config, std::vector<std::string>& overrides) {
  app.add_option("config", config, "Experiment YAML file")->required()->check(CLI::ExistingFile);
  app.add_option("overrides", overrides, "key=value overrides, as for `dtrain run`");
}

const DataSplit& DataCache::get(const Config& c) {
  const std::string key = data_identity(c.data, c.train.seed);
  if (key != key_) {
    data_ = load_data(c.data, c.train.seed);
    key_ = key;
  }
  return data_;
}

}  // namespace dtrain::cli
