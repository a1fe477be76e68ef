// The Kubernetes manifests in deploy/k8s (docs/cluster.md) against the real binary: every file is
// valid YAML with the fields Kubernetes requires; services select the pods they front; every
// `gyre worker` flag and GYRE_* variable they use is one that `gyre worker --help` documents; the
// job in the ConfigMap passes `gyre validate`; and the worker counts and ports agree between the
// job, the workloads and the services.

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <map>
#include <set>

#include "integration/run_util.h"
#include "test_paths.h"

namespace gyre::testing {
namespace {

const std::string kDir = std::string(GYRE_SOURCE_DIR) + "/deploy/k8s";

struct Manifests {
  std::map<std::string, std::vector<YAML::Node>> by_kind;
  std::vector<std::string> files;
};

Manifests Load() {
  Manifests m;
  const YAML::Node kustomization = YAML::LoadFile(kDir + "/kustomization.yaml");
  for (const auto& r : kustomization["resources"]) {
    const std::string file = r.as<std::string>();
    m.files.push_back(file);
    for (const YAML::Node& doc : YAML::LoadAllFromFile(kDir + "/" + file)) {
      m.by_kind[doc["kind"].as<std::string>()].push_back(doc);
    }
  }
  return m;
}

const YAML::Node* Find(const Manifests& m, const std::string& kind, const std::string& name) {
  auto it = m.by_kind.find(kind);
  if (it == m.by_kind.end()) return nullptr;
  for (const auto& d : it->second) {
    if (d["metadata"]["name"].as<std::string>() == name) return &d;
  }
  return nullptr;
}

std::vector<std::string> Strings(const YAML::Node& seq) {
  std::vector<std::string> out;
  for (const auto& s : seq) out.push_back(s.as<std::string>());
  return out;
}

TEST(DeployManifestsTest, EveryFileIsListedAndEveryObjectWellFormed) {
  Manifests m = Load();
  std::set<std::string> listed(m.files.begin(), m.files.end());
  auto names = ListDirectory(kDir);
  ASSERT_TRUE(names.ok()) << names.status();
  for (const auto& name : *names) {
    if (name.size() > 5 && name.substr(name.size() - 5) == ".yaml" &&
        name != "kustomization.yaml") {
      EXPECT_TRUE(listed.count(name)) << name << " is not in kustomization.yaml";
    }
  }
  int objects = 0;
  for (const auto& [kind, docs] : m.by_kind) {
    for (const auto& d : docs) {
      ++objects;
      ASSERT_TRUE(d["apiVersion"].IsScalar()) << kind;
      ASSERT_TRUE(d["metadata"]["name"].IsScalar()) << kind;
      EXPECT_EQ(d["metadata"]["labels"]["app.kubernetes.io/name"].as<std::string>(), "gyre")
          << kind << " " << d["metadata"]["name"].as<std::string>();
    }
  }
  EXPECT_EQ(objects, 8);  // 3 Services, a PVC, a ConfigMap, a Deployment, a StatefulSet, a Job
  // Workloads select their own pods; services select some workload's pods.
  std::vector<YAML::Node> templates;
  for (const char* kind : {"Deployment", "StatefulSet", "Job"}) {
    for (const auto& d : m.by_kind[kind]) {
      const YAML::Node labels = d["spec"]["template"]["metadata"]["labels"];
      templates.push_back(labels);
      if (d["spec"]["selector"]) {
        for (const auto& kv : d["spec"]["selector"]["matchLabels"]) {
          EXPECT_EQ(labels[kv.first.as<std::string>()].as<std::string>(),
                    kv.second.as<std::string>())
              << kind;
        }
      }
    }
  }
  for (const auto& svc : m.by_kind["Service"]) {
    bool matched = false;
    for (const auto& labels : templates) {
      bool all = true;
      for (const auto& kv : svc["spec"]["selector"]) {
        all = all && labels[kv.first.as<std::string>()] &&
              labels[kv.first.as<std::string>()].as<std::string>() == kv.second.as<std::string>();
      }
      matched = matched || all;
    }
    EXPECT_TRUE(matched) << "service " << svc["metadata"]["name"].as<std::string>()
                         << " selects no pods";
  }
}

TEST(DeployManifestsTest, TheWorkersFlagsAndVariablesAreOnesGyreWorkerAccepts) {
  Manifests m = Load();
  const std::string help = RunShell(std::string(GYRE_BINARY) + " worker --help");
  ASSERT_EQ(help.rfind("Usage: gyre worker", 0), 0u) << help;
  int workers = 0;
  for (const char* kind : {"StatefulSet", "Job"}) {
    for (const auto& d : m.by_kind[kind]) {
      for (const auto& c : d["spec"]["template"]["spec"]["containers"]) {
        const auto cmd = Strings(c["command"]);
        ASSERT_GE(cmd.size(), 4u);
        ASSERT_EQ(cmd[0], "gyre");
        ASSERT_EQ(cmd[1], "worker");
        ++workers;
        for (size_t i = 2; i < cmd.size(); ++i) {
          if (cmd[i].rfind("--", 0) == 0) {
            EXPECT_NE(help.find(cmd[i] + " "), std::string::npos)
                << cmd[i] << " is not a flag of gyre worker:\n"
                << help;
          }
        }
        for (const auto& e : c["env"]) {
          const std::string var = e["name"].as<std::string>();
          EXPECT_NE(help.find("$" + var), std::string::npos) << var << " is not documented:\n"
                                                             << help;
        }
        // The flag --port and the container's port agree.
        for (size_t i = 2; i + 1 < cmd.size(); ++i) {
          if (cmd[i] == "--port") {
            EXPECT_EQ(std::to_string(c["ports"][0]["containerPort"].as<int>()), cmd[i + 1]);
          }
        }
        // The worker's flags make sense to the binary: a dry parse with an unreachable controller
        // fails registering, not parsing (exit status 1, not 2).
        std::string line = std::string(GYRE_BINARY);
        for (size_t i = 1; i < cmd.size(); ++i) {
          line += " '" + (cmd[i] == "600" ? std::string("1") : cmd[i]) + "'";
        }
        line = "GYRE_CONTROLLER=127.0.0.1:1 GYRE_ADVERTISE_HOST=127.0.0.1 " + line;
        const std::string out = RunShell("(" + line + ") 2>&1; echo exit=$?");
        EXPECT_NE(out.find("exit=1"), std::string::npos) << line << "\n" << out;
        EXPECT_NE(out.find("could not register"), std::string::npos) << out;
      }
    }
  }
  EXPECT_EQ(workers, 2);
}

TEST(DeployManifestsTest, TheJobValidatesAndAgreesWithTheWorkloads) {
  Manifests m = Load();
  const YAML::Node* cm = Find(m, "ConfigMap", "gyre-job");
  ASSERT_NE(cm, nullptr);
  const std::string job_text = (*cm)["data"]["job.yaml"].as<std::string>();
  const std::string dir = MakeTempDir("k8s");
  const std::string path = dir + "/job.yaml";
  ASSERT_TRUE(WriteFileAtomic(path, job_text).ok());
  const std::string out = RunShell(std::string(GYRE_BINARY) + " validate " + path);
  EXPECT_NE(out.find(": OK"), std::string::npos) << out;
  const YAML::Node job = YAML::Load(job_text);
  EXPECT_EQ(job["cluster"]["mode"].as<std::string>(), "external");
  const YAML::Node* rollout = Find(m, "StatefulSet", "gyre-rollout");
  const YAML::Node* trainer = Find(m, "Job", "gyre-trainer");
  ASSERT_TRUE(rollout != nullptr && trainer != nullptr);
  EXPECT_EQ((*rollout)["spec"]["replicas"].as<int>(), job["rollout"]["workers"].as<int>());
  EXPECT_EQ((*trainer)["spec"]["completions"].as<int>(), job["trainer"]["workers"].as<int>());
  EXPECT_EQ((*trainer)["spec"]["parallelism"].as<int>(), job["trainer"]["workers"].as<int>());
  // The controller's port: the job's, its Service's, and the one the workers dial.
  const YAML::Node* svc = Find(m, "Service", "gyre-controller");
  ASSERT_NE(svc, nullptr);
  const int port = job["cluster"]["controller_port"].as<int>();
  EXPECT_EQ((*svc)["spec"]["ports"][0]["port"].as<int>(), port);
  const std::string metrics = job["metrics"]["endpoint"].as<std::string>();
  EXPECT_EQ(std::to_string((*svc)["spec"]["ports"][1]["port"].as<int>()),
            metrics.substr(metrics.rfind(':') + 1));
  for (const YAML::Node* w : {rollout, trainer}) {
    for (const auto& e : (*w)["spec"]["template"]["spec"]["containers"][0]["env"]) {
      if (e["name"].as<std::string>() == "GYRE_CONTROLLER") {
        EXPECT_EQ(e["value"].as<std::string>(), "gyre-controller:" + std::to_string(port));
      }
    }
  }
  // The controller's script runs the job from the ConfigMap's mount, in the job's run directory.
  const YAML::Node* dep = Find(m, "Deployment", "gyre-controller");
  ASSERT_NE(dep, nullptr);
  const std::string script =
      (*dep)["spec"]["template"]["spec"]["containers"][0]["args"][0].as<std::string>();
  EXPECT_NE(script.find("gyre train /etc/gyre/job.yaml"), std::string::npos);
  EXPECT_NE(script.find(job["job"]["output_dir"].as<std::string>() + "/" +
                        job["job"]["name"].as<std::string>()),
            std::string::npos)
      << script;
  const std::string train_help = RunShell(std::string(GYRE_BINARY) + " help");
  EXPECT_NE(train_help.find("--resume"), std::string::npos);
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace gyre::testing
