# Container image of the operator: `docker build -t egress-proxies-operator .`
# Stage 1 compiles src/ to dist/ and keeps only the runtime dependencies.
FROM node:24-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
# No install scripts: nothing at runtime needs a native addon (ssh2's optional crypto binding
# would otherwise be built for the build stage's Node), and the `node` devDependency's
# binary download is not needed inside a Node image.
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build \
 && npm prune --omit=dev --ignore-scripts --no-audit --no-fund

# Stage 2: Node and the compiled operator, run as an unprivileged user.
FROM node:24-slim
ENV NODE_ENV=production
WORKDIR /app
COPY --from=build /app/package.json ./package.json
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY bin ./bin
# 65532: the conventional "nonroot" uid; the Deployment runs with this uid and a read-only root.
USER 65532:65532
EXPOSE 8090 8080 8081
ENTRYPOINT ["node", "--max-semi-space-size=16", "/app/dist/cmd/main.js"]
CMD ["operator", "--providers-config", "/etc/egress-proxies-operator/providers.yaml", "--log-format", "json"]
